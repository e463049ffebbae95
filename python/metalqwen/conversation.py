"""A multi-turn chat, rendered by the checkpoint's chat template every turn as the server renders it.

Qwen's template drops the thinking of earlier answers, so a turn's prompt does not extend
the tokens the model saw: it shares them up to the end of the previous user turn. The
model's prefix cache (``load(prefix_cache_bytes=...)``) saves the state at the message
boundaries each prompt reports (where the system prompt and the last user turn end), so a
turn resumes there and feeds only the last answer (without its thinking) and the new
message, and the model reads the history exactly as its template writes it.

A user message may carry pictures (shown before its text, as Model.stream puts a text prompt's
images). The boundaries count one pad per picture, as the template renders it (Model.request
moves them past each picture's rows); the prefix cache keys pictures by their content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ContextFullError
from .images import IMAGE_TEXT
from .prefix_cache import message_boundaries
from .tokenizer import Tokenizer

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass
class _Turn:
    user: str
    reasoning: str
    content: str
    images: list = field(default_factory=list)  # the user message's pictures


@dataclass
class ChatPrompt:
    ids: list[int]  # the rendered conversation with the new user turn and the generation prompt
    boundaries: list[int]  # positions to snapshot for the next turns (Model.stream(boundaries=...))
    opens_thinking: bool  # the generation prompt ends inside <think>: the answer starts with its reasoning
    length: int  # prompt tokens once each picture's place holds its image tokens (len(ids) without pictures)
    images: list = field(default_factory=list)  # every picture of the conversation, in prompt order


class Conversation:
    """Prompts for a chat: ``prompt(text)`` gives what to generate the next answer from;
    ``record(text, reply)`` then stores the turn (also a partial answer after an interrupt).
    A turn that is never recorded leaves the conversation as it was."""

    def __init__(self, tokenizer: Tokenizer, system: str | None = None, enable_thinking: bool | None = None,
                 template_kwargs: dict | None = None, image_tokens: Callable[[Any], int] | None = None):
        """``enable_thinking`` (None: the template's default) and ``template_kwargs`` (further
        template variables, as mlx-lm's --chat-template-config) go to every rendering;
        ``image_tokens(picture)``: the prompt tokens a picture takes (for ChatPrompt.length)."""
        self.tokenizer = tokenizer
        self.image_tokens = image_tokens
        self.system = system
        self.template_kwargs = dict(template_kwargs or {})
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking
        self.turns: list[_Turn] = []

    def _messages(self, turns: list[_Turn], user: str, images: list = ()) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        body = [m for t in turns for m in ({"role": "user", "content": IMAGE_TEXT * len(t.images) + t.user},
                                           {"role": "assistant", "content": t.content,
                                            "reasoning_content": t.reasoning or None})]
        return head + body + [{"role": "user", "content": IMAGE_TEXT * len(images) + user}]

    def _render(self, turns: list[_Turn], user: str, images: list) -> ChatPrompt:
        messages = self._messages(turns, user, images)
        text = self.tokenizer.apply_chat_template(messages, **self.template_kwargs)
        ids = self.tokenizer.encode(text)
        pictures = [p for t in turns for p in t.images] + list(images)
        if pictures and self.image_tokens is None:
            raise ValueError("this conversation takes no images (no image_tokens given)")
        length = len(ids) + sum(self.image_tokens(p) - 1 for p in pictures)
        return ChatPrompt(ids, message_boundaries(self.tokenizer, messages, ids, **self.template_kwargs),
                          text.rfind(_THINK_OPEN) > text.rfind(_THINK_CLOSE), length, pictures)

    def prompt(self, user: str, images: list = ()) -> ChatPrompt:
        """Every recorded turn and the new user message (its ``images`` before its text), rendered by
        the template."""
        if not isinstance(user, str) or not user.strip():
            raise ValueError("a chat message needs some text")
        return self._render(self.turns, user, list(images))

    def record(self, prompt: ChatPrompt, user: str, reply: str, images: list = ()) -> None:
        """Stores a turn: the prompt ``prompt(user, images)`` gave and the text generated for it, split
        into reasoning and answer at ``</think>`` (all reasoning when cut short inside it)."""
        reasoning, content = "", reply
        if _THINK_CLOSE in reply:
            reasoning, content = reply.split(_THINK_CLOSE, 1)
        elif prompt.opens_thinking:
            reasoning, content = reply, ""
        self.turns.append(_Turn(user, reasoning.removeprefix(_THINK_OPEN).strip("\n"), content.lstrip("\n"),
                                list(images)))

    def restart(self, user: str, limit: int, images: list = ()) -> ChatPrompt:
        """The prompt of the last turns that fit in ``limit`` tokens with the new message (the
        older turns are forgotten). Raises ContextFullError when the message alone does not fit."""
        for first in range(len(self.turns) + 1):
            found = self._render(self.turns[first:], user, list(images))
            if found.length <= limit:
                self.turns = self.turns[first:]
                return found
        raise ContextFullError(f"the message alone needs {found.length} tokens, more than the {limit} available")
