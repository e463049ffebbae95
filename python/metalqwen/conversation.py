"""A multi-turn chat kept as the tokens the model actually saw.

Re-rendering the whole history with the chat template each turn rarely reproduces the
cached tokens (Qwen's template drops the thinking of earlier answers, and the generated
`<think>` is not in the re-rendered text), so the engine would re-read the conversation
every turn. Instead each turn appends only its own rendering to the tokens fed and
generated so far: the cache always holds a prefix of the next prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ContextFullError
from .tokenizer import Tokenizer

# Stand-ins the template renders verbatim, to cut out the text it puts between messages.
_REPLY_MARK = "\x1fmetalqwen-reply\x1f"
_USER_MARK = "\x1fmetalqwen-user\x1f"


@dataclass
class _Turn:
    user: str
    reply: str


class Conversation:
    """Prompts for a chat whose earlier turns stay in the engine's cache.

    ``prompt(text)`` gives the ids to generate the next answer from; ``record(...)`` then
    stores what was generated (also a partial answer after an interrupt). A turn that is
    never recorded leaves the conversation as it was."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids, system: str | None = None):
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.system = system
        self.turns: list[_Turn] = []
        self.ids: list[int] = []  # every token fed and generated, in order

    def _messages(self, turns: list[_Turn], user: str) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        body = [m for t in turns for m in ({"role": "user", "content": t.user}, {"role": "assistant", "content": t.reply})]
        return head + body + [{"role": "user", "content": user}]

    def prompt(self, user: str) -> list[int]:
        """The conversation's tokens followed by the new user turn and the generation prompt."""
        if not isinstance(user, str) or not user.strip():
            raise ValueError("a chat message needs some text")
        if not self.ids:  # the first turn, or the first after a restart
            return self.tokenizer.encode_chat(self._messages(self.turns, user))
        return self.ids + self.tokenizer.encode(self._turn_text(user))

    def _turn_text(self, user: str) -> str:
        """What the template writes after an answer: the answer's end, the user turn, the
        generation prompt. The end is left out when the model already generated it (eos)."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "."}, {"role": "assistant", "content": _REPLY_MARK},
             {"role": "user", "content": _USER_MARK}], add_generation_prompt=True)
        after_reply = text[text.index(_REPLY_MARK) + len(_REPLY_MARK):]
        if self.ids[-1] in self.eos:
            closing = self.tokenizer.decode([self.ids[-1]])
            if after_reply.startswith(closing):
                after_reply = after_reply[len(closing):]
        return after_reply.replace(_USER_MARK, user)

    def record(self, prompt_ids: list[int], user: str, generated: list[int], reply: str) -> None:
        """Stores a turn: the prompt ids ``prompt(user)`` gave and every token generated (eos included)."""
        self.ids = list(prompt_ids) + list(generated)
        self.turns.append(_Turn(user, reply))

    def restart(self, user: str, limit: int) -> list[int]:
        """A fresh context: the prompt of the last turns that fit in ``limit`` tokens with the
        new message (rendered by the template, from text). Raises ContextFullError when the
        message alone does not fit."""
        for first in range(len(self.turns) + 1):
            ids = self.tokenizer.encode_chat(self._messages(self.turns[first:], user))
            if len(ids) <= limit:
                self.turns = self.turns[first:]
                self.ids = []
                return ids
        raise ContextFullError(f"the message alone needs {len(ids)} tokens, more than the {limit} available")
