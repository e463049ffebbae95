"""Loading a Qwen3.5 checkpoint onto a device, and generating text from it."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

import numpy as np

from . import _core, gpu
from .checkpoint import Checkpoint, load_checkpoint
from .config import ModelConfig
from .tokenizer import StopMatcher, Tokenizer

__all__ = ["load", "Model", "Generation", "GenerationStats", "Chunk"]

Prompt = Union[str, Sequence[int]]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0  # already in the cache from the previous call
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    engine: dict = field(default_factory=dict)  # the engine's counters after the call

    @property
    def prompt_tokens_per_second(self) -> float:
        fed = self.prompt_tokens - self.prompt_tokens_reused
        return fed / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first token comes from prefill; decode time covers the rest.
        n = self.generated_tokens - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0


@dataclass
class Generation:
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" (eos or stop string) | "length"
    stats: GenerationStats


@dataclass
class Chunk:
    text: str  # new complete text (UTF-8 safe; may be empty while a character is incomplete)
    token: int | None  # the token this chunk came from (None for the final flush)


class Model:
    """A checkpoint on a device. Not thread-safe: one generation at a time."""

    def __init__(self, checkpoint: Checkpoint, tokenizer: Tokenizer, device: gpu.Device, engine):
        self.checkpoint = checkpoint
        self.config: ModelConfig = checkpoint.config
        self.tokenizer = tokenizer
        self.device = device
        self._engine = engine
        self.eos_token_ids = sorted(set(self.config.eos_token_ids) | {tokenizer.eos_token_id} - {None})
        # Statistics of the latest generate/stream (complete once the stream is exhausted).
        self.last_stats: GenerationStats | None = None

    @property
    def max_context(self) -> int:
        return self._engine.max_context

    def counters(self) -> dict:
        """Engine counters: steps (command buffers), dispatches, CPU waits, decoded tokens, weight bytes per token."""
        return dict(self._engine.counters())

    def reset(self) -> None:
        """Forgets the cached conversation."""
        self._engine.reset()

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (float32 [len(token_ids), vocab]) at every position, from a fresh state."""
        ids = self._check_ids(token_ids)
        self._engine.reset()
        return self._engine.prefill(ids, logits="all")

    def prompt_ids(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of a prompt: a list of ids is used as is; text is encoded (with the chat template if chat)."""
        if isinstance(prompt, str):
            if chat:
                return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt)
        return self._check_ids(prompt)

    def generate(self, prompt: Prompt, max_tokens: int = 256, **options) -> Generation:
        """Generates up to ``max_tokens`` tokens. Options as for ``stream``."""
        text, tokens = [], []
        stream = self.stream(prompt, max_tokens=max_tokens, **options)
        for chunk in stream:
            text.append(chunk.text)
            if chunk.token is not None:
                tokens.append(chunk.token)
        return Generation(tokens=tokens, text="".join(text), finish_reason=self._finish, stats=self.last_stats)

    def stream(self, prompt: Prompt, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, stop: Sequence[str] | None = None,
               chat: bool = False) -> Iterator[Chunk]:
        """Yields text as tokens are generated. ``prompt``: text (chat template applied when ``chat``) or ids.

        Greedy when temperature is 0; else sampling with top-k (0 = off) and top-p (1 = off),
        reproducible for a given seed. Stops at an eos token, a ``stop`` string (not included in
        the text) or ``max_tokens``. The cache is kept: a next prompt that extends this
        conversation only feeds the new tokens."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError("temperature must be >= 0, top_p in (0, 1], top_k >= 0")
        ids = self.prompt_ids(prompt, chat)
        if not ids:
            raise ValueError("the prompt is empty")
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        sampling = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=int(seed))
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        self._finish = "length"

        start = time.perf_counter()
        stats.prompt_tokens_reused = self._feed_prompt(ids, sampling)
        stats.prompt_seconds = time.perf_counter() - start

        decoder = self.tokenizer.stream_decoder()
        stopper = StopMatcher(stop or [])
        eos = set(self.eos_token_ids)
        start = time.perf_counter()
        self._engine.decode_begin(max_tokens, **sampling)
        hit = False
        try:
            while (token := self._engine.decode_next()) is not None:
                stats.generated_tokens += 1
                if token in eos:
                    self._finish = "stop"
                    break
                text, hit = stopper.feed(decoder.add(token))
                yield Chunk(text=text, token=token)
                if hit:
                    self._finish = "stop"
                    break
        finally:
            self._engine.decode_end()
            stats.decode_seconds = time.perf_counter() - start
            stats.engine = self.counters()
        if not hit:  # text after a stop string is dropped; otherwise flush what is held back
            tail, _ = stopper.feed(decoder.flush())
            tail += stopper.flush()
            if tail:
                yield Chunk(text=tail, token=None)

    def _feed_prompt(self, ids: list[int], sampling: dict) -> int:
        """Prefills what the cache lacks of ``ids``; returns how many tokens were reused."""
        cached = self._engine.tokens()
        reuse = len(cached) if 0 < len(cached) < len(ids) and ids[: len(cached)] == cached else 0
        if reuse == 0:
            self._engine.reset()
        if len(ids) + 1 > self.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens; max_context is {self.max_context}")
        self._engine.prefill(ids[reuse:], logits="none", **sampling)
        return reuse

    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids outside the vocabulary (0..{self.config.vocab_size - 1}): {bad[:5]}")
        if not ids:
            raise ValueError("no token ids")
        return ids


class _ProgressBar:
    """A one-line progress bar on stderr, redrawn at most every 1 % (called from the engine)."""

    def __init__(self, label: str, width: int = 30):
        self.label, self.width, self.shown = label, width, -1

    def __call__(self, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if percent != self.shown:
            self.shown = percent
            filled = self.width * percent // 100
            print(f"\rmetalqwen: {self.label} [{'#' * filled}{'.' * (self.width - filled)}] {percent:3d}% "
                  f"of {total / 2**30:.2f} GiB", end="", file=sys.stderr, flush=True)

    def finish(self, message: str) -> None:
        print(f"\nmetalqwen: {message}", file=sys.stderr, flush=True)


def load(path: str | os.PathLike, device: str | gpu.Device | None = None, max_context: int = 4096, kv_bits: int = 8,
         prefill_chunk: int = 64, progress: bool | None = None) -> Model:
    """Loads an MLX-format Qwen3.5 checkpoint folder.

    ``device``: "metal", "cpu", a gpu.Device, or None for the best available. ``max_context``
    bounds prompt + generated tokens (the caches are sized for it); ``kv_bits`` 8 (q8 KV
    cache) or 16 (f16). Bad checkpoints raise CheckpointError naming the file and tensor."""
    if kv_bits not in (8, 16):
        raise ValueError(f"kv_bits must be 8 or 16, got {kv_bits}")
    if max_context < 2:
        raise ValueError(f"max_context must be at least 2, got {max_context}")
    show = sys.stderr.isatty() if progress is None else progress
    started = time.perf_counter()
    ckpt = load_checkpoint(path)
    tokenizer = Tokenizer.from_folder(ckpt.path)
    dev = device if isinstance(device, gpu.Device) else gpu.Device(device)
    desc = ckpt.describe()
    bar = _ProgressBar(f"loading onto {dev.kind}") if show else None
    engine = _core.Engine(dev._native, desc["dims"], desc["tensors"], max_context, kv_bits, prefill_chunk, bar)
    if bar:
        bar.finish(f"ready in {time.perf_counter() - started:.1f} s")
    return Model(ckpt, tokenizer, dev, engine)
