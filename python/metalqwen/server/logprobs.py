"""OpenAI's two logprobs shapes from the engine's per-token log-probabilities (Chunk.logprob
and Chunk.top_logprobs, raw logits as vLLM reports by default). ``bytes`` are the token's own
bytes (a byte-level token may hold part of a UTF-8 character); its ``token`` is their text, or
for bytes that are no UTF-8 text alone ``bytes:`` and their escapes (``bytes:\\xf0\\x9f``, as
OpenAI writes them), so no two tokens share a name (the legacy shape keys alternatives by it)."""

from __future__ import annotations

import codecs
from functools import lru_cache
from typing import Iterable

from ..generation import Chunk

# JSON has no -inf: vLLM reports a token the model rules out at this floor.
_FLOOR = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)


def _name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TokenTexts:
    """Token id -> (name, bytes) of that token (cached: a vocabulary is large, a reply's ids few)."""

    def __init__(self, tokenizer):
        self._of = lru_cache(maxsize=65536)(lambda token_id: (_name(raw := tokenizer.token_bytes(token_id)), raw))

    def text(self, token_id: int) -> str:
        return self._of(token_id)[0]

    def raw(self, token_id: int) -> bytes:
        return self._of(token_id)[1]

    def entry(self, token_id: int, logprob: float) -> dict:
        name, raw = self._of(token_id)
        return {"token": name, "logprob": _value(logprob), "bytes": list(raw)}


def chat_logprobs(texts: TokenTexts, chunks: Iterable[Chunk]) -> dict:
    """``choices[i].logprobs`` of a chat completion (or of a stream chunk) for these chunks' tokens."""
    content = [{**texts.entry(c.token, c.logprob), "top_logprobs": [texts.entry(t, lp) for t, lp in c.top_logprobs]}
               for c in chunks if c.token is not None]
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """The legacy ``/v1/completions`` shape; ``text_offset`` counts on across the calls of one
    response: a token's offset is the characters of the text before it, decoded as the text is
    (a character split over tokens counts once, at its last token; a byte that is no UTF-8, as U+FFFD)."""

    def __init__(self, texts: TokenTexts):
        self.texts, self.offset = texts, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, chunks: Iterable[Chunk]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for c in chunks:
            if c.token is None:
                continue
            out["tokens"].append(self.texts.text(c.token))
            out["token_logprobs"].append(_value(c.logprob))
            out["top_logprobs"].append({self.texts.text(t): _value(lp) for t, lp in c.top_logprobs})
            out["text_offset"].append(self.offset)
            self.offset += len(self.decoder.decode(self.texts.raw(c.token)))
        return out
