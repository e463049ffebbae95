"""A multi-turn chat, rendered by the checkpoint's chat template every turn as the server renders it.

Qwen's template drops the thinking of earlier answers, so a turn's prompt does not extend
the tokens the model saw: it shares them up to the end of the previous user turn. The
model's prefix cache (``load(prefix_cache_bytes=...)``) saves the state at the message
boundaries each prompt reports (where the system prompt and the last user turn end), so a
turn resumes there and feeds only the last answer (without its thinking) and the new
message, and the model reads the history exactly as its template writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ContextFullError
from .prefix_cache import message_boundaries
from .tokenizer import Tokenizer

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass
class _Turn:
    user: str
    reasoning: str
    content: str


@dataclass
class ChatPrompt:
    ids: list[int]  # the rendered conversation with the new user turn and the generation prompt
    boundaries: list[int]  # positions to snapshot for the next turns (Model.stream(boundaries=...))
    opens_thinking: bool  # the generation prompt ends inside <think>: the answer starts with its reasoning


class Conversation:
    """Prompts for a chat: ``prompt(text)`` gives what to generate the next answer from;
    ``record(text, reply)`` then stores the turn (also a partial answer after an interrupt).
    A turn that is never recorded leaves the conversation as it was."""

    def __init__(self, tokenizer: Tokenizer, system: str | None = None, enable_thinking: bool | None = None,
                 template_kwargs: dict | None = None):
        """``enable_thinking`` (None: the template's default) and ``template_kwargs`` (further
        template variables, as mlx-lm's --chat-template-config) go to every rendering."""
        self.tokenizer = tokenizer
        self.system = system
        self.template_kwargs = dict(template_kwargs or {})
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking
        self.turns: list[_Turn] = []

    def _messages(self, turns: list[_Turn], user: str) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        body = [m for t in turns for m in ({"role": "user", "content": t.user},
                                           {"role": "assistant", "content": t.content,
                                            "reasoning_content": t.reasoning or None})]
        return head + body + [{"role": "user", "content": user}]

    def _render(self, turns: list[_Turn], user: str) -> ChatPrompt:
        messages = self._messages(turns, user)
        text = self.tokenizer.apply_chat_template(messages, **self.template_kwargs)
        ids = self.tokenizer.encode(text)
        return ChatPrompt(ids, message_boundaries(self.tokenizer, messages, ids, **self.template_kwargs),
                          text.rfind(_THINK_OPEN) > text.rfind(_THINK_CLOSE))

    def prompt(self, user: str) -> ChatPrompt:
        """Every recorded turn and the new user message, rendered by the template."""
        if not isinstance(user, str) or not user.strip():
            raise ValueError("a chat message needs some text")
        return self._render(self.turns, user)

    def record(self, prompt: ChatPrompt, user: str, reply: str) -> None:
        """Stores a turn: the prompt ``prompt(user)`` gave and the text generated for it, split
        into reasoning and answer at ``</think>`` (all reasoning when cut short inside it)."""
        reasoning, content = "", reply
        if _THINK_CLOSE in reply:
            reasoning, content = reply.split(_THINK_CLOSE, 1)
        elif prompt.opens_thinking:
            reasoning, content = reply, ""
        self.turns.append(_Turn(user, reasoning.removeprefix(_THINK_OPEN).strip("\n"), content.lstrip("\n")))

    def restart(self, user: str, limit: int) -> ChatPrompt:
        """The prompt of the last turns that fit in ``limit`` tokens with the new message (the
        older turns are forgotten). Raises ContextFullError when the message alone does not fit."""
        for first in range(len(self.turns) + 1):
            found = self._render(self.turns[first:], user)
            if len(found.ids) <= limit:
                self.turns = self.turns[first:]
                return found
        raise ContextFullError(f"the message alone needs {len(found.ids)} tokens, more than the {limit} available")
