"""OpenAI's two logprobs shapes from the engine's per-token log-probabilities (Chunk.logprob
and Chunk.top_logprobs, raw logits as vLLM reports by default). A token's text is the
tokenizer's decode of that id alone; ``bytes`` are its UTF-8 bytes, as OpenAI gives them."""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

from ..model import Chunk

# JSON has no -inf: vLLM reports a token the model rules out at this floor.
_FLOOR = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)


class TokenTexts:
    """Token id -> the tokenizer's decode of that id alone (cached: a vocabulary is large, a reply's ids few)."""

    def __init__(self, tokenizer):
        self.text = lru_cache(maxsize=65536)(lambda token_id: tokenizer.decode([token_id]))

    def entry(self, token_id: int, logprob: float) -> dict:
        text = self.text(token_id)
        return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(texts: TokenTexts, chunks: Iterable[Chunk]) -> dict:
    """``choices[i].logprobs`` of a chat completion (or of a stream chunk) for these chunks' tokens."""
    content = [{**texts.entry(c.token, c.logprob), "top_logprobs": [texts.entry(t, lp) for t, lp in c.top_logprobs]}
               for c in chunks if c.token is not None]
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """The legacy ``/v1/completions`` shape; ``text_offset`` counts on across the calls of one
    response (each token's offset is the length of the token texts before it, as vLLM counts)."""

    def __init__(self, texts: TokenTexts):
        self.texts, self.offset = texts, 0

    def add(self, chunks: Iterable[Chunk]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for c in chunks:
            if c.token is None:
                continue
            text = self.texts.text(c.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(_value(c.logprob))
            out["top_logprobs"].append({self.texts.text(t): _value(lp) for t, lp in c.top_logprobs})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
