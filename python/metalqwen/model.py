"""Loading a Qwen3.5 checkpoint onto a device, and generating text from it."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

import numpy as np

from . import _core, arguments, gpu
from .checkpoint import Checkpoint, load_checkpoint
from .config import ModelConfig
from .errors import ContextFullError
from .prefix_cache import PrefixCache
from .progress import LoadProgress, PrefillProgress
from .tokenizer import StopMatcher, Tokenizer

__all__ = ["load", "Model", "Generation", "GenerationStats", "Chunk"]

Prompt = Union[str, Sequence[int]]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_tokens_reused: int = 0  # already in the cache from the previous call
    generated_tokens: int = 0
    context_full: bool = False  # generation stopped because max_context was reached
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
    finish_reason: str  # "stop" (eos or stop string) | "length" (max_tokens or max_context reached)
    stats: GenerationStats


@dataclass
class Chunk:
    text: str  # new complete text (UTF-8 safe; may be empty while a character is incomplete)
    token: int | None  # the token this chunk came from (None for the final flush)


class Model:
    """A checkpoint on a device. Not thread-safe: one generation at a time."""

    def __init__(self, checkpoint: Checkpoint, tokenizer: Tokenizer, device: gpu.Device, engine, progress: bool,
                 prefix_cache: PrefixCache | None = None):
        self.checkpoint = checkpoint
        self.config: ModelConfig = checkpoint.config
        self.tokenizer = tokenizer
        self.device = device
        self._engine = engine
        self.eos_token_ids = sorted(set(self.config.eos_token_ids) | {tokenizer.eos_token_id} - {None})
        self.progress = progress  # show prefill progress on stderr
        self.prefix_cache = prefix_cache
        # Statistics of the latest generate/stream (complete once the stream is exhausted).
        self.last_stats: GenerationStats | None = None
        # Every token the latest generate/stream produced, eos included (also when interrupted).
        self.last_tokens: list[int] = []
        self.last_finish_reason = "stop"  # of the latest generate/stream: "stop" | "length"

    @property
    def max_context(self) -> int:
        return self._engine.max_context

    def counters(self) -> dict:
        """Engine counters: steps (command buffers), dispatches and barriers (dependent dispatch boundaries),
        host encode µs, CPU waits, decoded tokens, weight bytes per token, memory estimate; ``*_last_step``
        for the latest step."""
        return dict(self._engine.counters())

    def reset(self) -> None:
        """Forgets the cached conversation."""
        self._engine.reset()

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (float32 [len(token_ids), vocab]) at every position, from a fresh state."""
        ids = arguments.token_ids("token_ids", token_ids, self.config.vocab_size)
        self._check_fits(ids)
        self._engine.reset()
        return self._engine.prefill(ids, logits="all")

    def prompt_ids(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of a prompt: a list of ids is used as is; text is encoded (with the chat template if chat)."""
        if arguments.prompt_kind(prompt) == "ids":
            return arguments.token_ids("prompt", prompt, self.config.vocab_size)
        if chat:
            if not prompt.strip():
                raise ValueError("prompt is empty (a chat message needs some text)")
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def generate(self, prompt: Prompt, max_tokens: int = 256, **options) -> Generation:
        """Generates up to ``max_tokens`` tokens. Options as for ``stream``."""
        text, tokens = [], []
        stream = self.stream(prompt, max_tokens=max_tokens, **options)
        for chunk in stream:
            text.append(chunk.text)
            if chunk.token is not None:
                tokens.append(chunk.token)
        return Generation(tokens=tokens, text="".join(text), finish_reason=self.last_finish_reason,
                          stats=self.last_stats)

    def stream(self, prompt: Prompt, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, stop: Sequence[str] | None = None,
               chat: bool = False, boundaries: Sequence[int] = (), min_p: float = 0.0,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
               repetition_penalty: float = 1.0) -> Iterator[Chunk]:
        """Yields text as tokens are generated. ``prompt``: text (chat template applied when ``chat``) or ids.

        Greedy when temperature is 0; else sampling with top-k (0 = off), top-p (1 = off) and
        min-p (0 = off), in that order after the temperature, reproducible for a given seed.
        Before either, on the GPU: ``repetition_penalty`` (1 = off) divides the positive logits
        (multiplies the negative ones) of every token in the prompt or generated so far, then
        ``frequency_penalty`` times a token's count and ``presence_penalty`` (0 = off) are
        subtracted for the tokens generated so far in this call (vLLM's definitions). Stops at an eos token, a ``stop`` string (not included in
        the text), ``max_tokens`` or the end of the context (``finish_reason`` "length",
        ``stats.context_full``); a prompt that leaves no room raises ContextFullError. The cache
        is kept: a next prompt that extends this conversation only feeds the new tokens. With a
        prefix cache (``load(prefix_cache_bytes=...)``) the state is also saved at the end of the
        prompt and at ``boundaries`` (prompt positions, e.g. message ends), and a prompt resumes
        from the longest saved prefix it starts with. Ctrl-C (KeyboardInterrupt) stops within
        one step and leaves the cache holding what was fed."""
        max_tokens = arguments.integer("max_tokens", max_tokens, low=1, allowed="an integer >= 1")
        sampling = arguments.sampling(temperature, top_p, top_k, seed, min_p, presence_penalty, frequency_penalty,
                                      repetition_penalty)
        sampling.setdefault("seed", int.from_bytes(os.urandom(8), "little"))
        stopper = StopMatcher(arguments.stop_strings(stop))
        ids = self.prompt_ids(prompt, chat)
        self._check_fits(ids)
        return self._run(ids, max_tokens, sampling, stopper, boundaries)

    def _run(self, ids: list[int], max_tokens: int, sampling: dict, stopper: StopMatcher,
             boundaries: Sequence[int]) -> Iterator[Chunk]:
        """The generator behind ``stream`` (arguments already checked, so errors come at the call)."""
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        self.last_tokens = []
        self.last_finish_reason = "length"
        # Prefill chose one token and each decode step feeds one: room for max_context - len(ids).
        room = self.max_context - len(ids)
        budget = min(max_tokens, room)

        start = time.perf_counter()
        stats.prompt_tokens_reused = self._feed_prompt(ids, sampling, boundaries)
        stats.prompt_seconds = time.perf_counter() - start

        decoder = self.tokenizer.stream_decoder()
        eos = set(self.eos_token_ids)
        start = time.perf_counter()
        self._engine.decode_begin(budget, **sampling)
        hit = False
        try:
            while (token := self._engine.decode_next()) is not None:
                stats.generated_tokens += 1
                self.last_tokens.append(token)
                if token in eos:
                    self.last_finish_reason = "stop"
                    break
                text, hit = stopper.feed(decoder.add(token))
                yield Chunk(text=text, token=token)
                if hit:
                    self.last_finish_reason = "stop"
                    break
        finally:
            self._engine.decode_end()
            # An interrupt that lands while decode_next runs loses the token it returned, but
            # that token was fed: take it from the cache so last_tokens matches the cache.
            fed = self._engine.tokens()[len(ids):]
            if len(fed) > len(self.last_tokens):
                self.last_tokens = fed
                stats.generated_tokens = len(fed)
            stats.decode_seconds = time.perf_counter() - start
            stats.context_full = self.last_finish_reason == "length" and stats.generated_tokens == room < max_tokens
            stats.engine = self.counters()
        if not hit:  # text after a stop string is dropped; otherwise flush what is held back
            tail, _ = stopper.feed(decoder.flush())
            tail += stopper.flush()
            if tail:
                yield Chunk(text=tail, token=None)

    def _check_fits(self, ids: list[int]) -> None:
        """ContextFullError unless ``ids`` and the token chosen after them fit in max_context."""
        if len(ids) + 1 > self.max_context:
            raise ContextFullError(f"the prompt does not fit: {len(ids)} tokens + 1 for the next token exceed "
                                   f"max_context {self.max_context} (load with a larger max_context, or shorten "
                                   "the prompt)")

    def _feed_prompt(self, ids: list[int], sampling: dict, boundaries: Sequence[int] = ()) -> int:
        """Prefills what the cache lacks of ``ids`` (progress on stderr past a second, when
        shown), resuming from the live state or the prefix cache's longest match and saving
        snapshots there; returns how many tokens were reused."""
        cached = self._engine.tokens()
        reuse = len(cached) if 0 < len(cached) < len(ids) and ids[: len(cached)] == cached else 0
        snapshot_at = []
        if self.prefix_cache is not None:
            saved = self.prefix_cache.longest(ids)
            if saved is not None and saved.position > reuse:
                self._engine.restore(saved)
                reuse = saved.position
            snapshot_at = sorted({int(b) for b in boundaries if reuse < b < len(ids)} | {len(ids)})
        if reuse == 0:
            self._engine.reset()
        bar = PrefillProgress() if self.progress else None
        taken = []
        try:
            self._engine.prefill(ids[reuse:], logits="none", progress=bar, snapshot_at=snapshot_at, snapshots=taken,
                                 **sampling)
        finally:
            if bar:
                bar.close()
            for snapshot in taken:
                self.prefix_cache.add(snapshot)
        return reuse

def load(path: str | os.PathLike, device: str | gpu.Device | None = None, max_context: int = 4096, kv_bits: int = 8,
         prefill_chunk: int = 64, progress: bool | None = None, prefix_cache_bytes: int = 0) -> Model:
    """Loads an MLX-format Qwen3.5 checkpoint folder.

    ``device``: "metal", "cpu", a gpu.Device, or None for the best available. ``max_context``
    bounds prompt + generated tokens (the caches are sized for it); ``kv_bits`` 8 (q8 KV
    cache) or 16 (f16). ``progress`` (default: when stderr is a terminal) shows the load,
    a first-run kernel compile and prefills longer than a second on stderr.
    ``prefix_cache_bytes`` > 0 keeps snapshots of the sequence state up to that many bytes of
    device memory (see ``prefix_cache.PrefixCache``; the server uses it). Bad
    checkpoints raise CheckpointError naming the file and tensor."""
    if isinstance(kv_bits, bool) or kv_bits not in (8, 16):
        raise ValueError(f"kv_bits must be 8 or 16, got {kv_bits!r}")
    max_context = arguments.integer("max_context", max_context, low=2, allowed="an integer >= 2")
    prefill_chunk = arguments.integer("prefill_chunk", prefill_chunk, low=1, allowed="an integer >= 1")
    prefix_cache_bytes = arguments.integer("prefix_cache_bytes", prefix_cache_bytes, low=0, allowed="bytes >= 0")
    if device is not None and not isinstance(device, (str, gpu.Device)):
        raise TypeError(f"device must be 'metal', 'cpu', a metalqwen.gpu.Device or None, got {type(device).__name__}")
    show = sys.stderr.isatty() if progress is None else bool(progress)
    started = time.perf_counter()
    ckpt = load_checkpoint(path)
    tokenizer = Tokenizer.from_folder(ckpt.path)
    dev = device if isinstance(device, gpu.Device) else gpu.Device(device)
    desc = ckpt.describe()
    shown = LoadProgress(dev.kind) if show else None
    try:
        engine = _core.Engine(dev._native, desc["dims"], desc["tensors"], max_context, kv_bits, prefill_chunk, shown)
    finally:
        if shown:
            shown.close()
    if shown:
        print(f"metalqwen: ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return Model(ckpt, tokenizer, dev, engine, progress=show,
                 prefix_cache=PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None)
