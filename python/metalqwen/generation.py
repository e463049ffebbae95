"""What one generation is made of, shared by ``Model.stream``, ``batching.Scheduler`` and the
server: a checked ``Request``, the ``Output`` that turns generated tokens into ``Chunk``s (stop
at an eos token or a stop string, log-probabilities, UTF-8-safe text), the ``Generation`` and
its ``GenerationStats``, and the ``Runner`` that resumes, feeds and decodes a request's tokens
on the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

from . import _core, speculative as spec
from .prefix_cache import PrefixCache
from .progress import PrefillProgress
from .tokenizer import StopMatcher, Tokenizer

if TYPE_CHECKING:  # llguidance is imported by the first constrained request only
    from .constraints import Constraint

__all__ = ["Chunk", "Generation", "GenerationStats", "Output", "Prompt", "Request", "Runner", "count_speculation",
           "count_verify"]

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
    # Speculative decoding in this call: verify steps, drafts fed and accepted, and the same per depth.
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_at(self) -> list[float]:
        """Per draft depth: the share of drafts at that depth that were accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_verify_step(self) -> float:
        return (self.verify_steps + self.accepted) / self.verify_steps if self.verify_steps else 0.0

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
    tokens: list[int]  # every generated token, the eos that ended it included
    text: str
    finish_reason: str  # "stop" (eos or stop string) | "length" (max_tokens or max_context reached)
    stats: GenerationStats


@dataclass
class Chunk:
    text: str  # new complete text (UTF-8 safe; may be empty while a character is incomplete)
    token: int | None  # the token this chunk came from (None for the final flush)
    # With stream(logprobs=N): the token's log-probability over the raw logits (before
    # logit_bias, penalties and temperature; under a grammar its refused tokens at -inf), and
    # the N most likely (id, logprob), ties lower id first.
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Request:
    """A checked generation request (``Model.request``): what ``Model.stream`` runs, and what a
    ``batching.Scheduler`` runs beside others."""
    ids: list[int]  # the prompt's token ids
    max_tokens: int
    sampling: dict  # the engine's sampling keywords (seed set, logprobs -1 when off)
    stop: list[str]
    boundaries: Sequence[int]  # prompt positions worth a prefix-cache snapshot
    drafter: spec.Drafter | None  # None: plain decoding
    # The grammar's state for this request (sampling["token_mask"] set); None: unconstrained.
    constraint: Constraint | None = None
    # The prompt's images (images.PreparedImages: ids already expanded); None: text only.
    images: Any = None


class Output:
    """Generated tokens of one request turned into Chunks: stops at an eos token or a stop
    string (its text dropped), releases UTF-8-safe text, and keeps the tokens and finish reason."""

    def __init__(self, request: Request, tokenizer: Tokenizer, eos_token_ids: Sequence[int]):
        self.stats = GenerationStats(prompt_tokens=len(request.ids))
        self.tokens: list[int] = []  # every generated token, eos included
        self.finish_reason = "length"  # "stop" once an eos token or a stop string ended it
        self.done = False
        self._decoder = tokenizer.stream_decoder()
        self._stopper = StopMatcher(request.stop)
        self._eos = set(eos_token_ids)
        self._hit = False

    def add(self, token: int, logprobs: tuple | None = None) -> Chunk | None:
        """The chunk of one generated token (None for an eos token, which ends the output)."""
        self.stats.generated_tokens += 1
        self.tokens.append(token)
        if token in self._eos:
            self.finish_reason, self.done = "stop", True
            return None
        text, self._hit = self._stopper.feed(self._decoder.add(token))
        if self._hit:
            self.finish_reason, self.done = "stop", True
        if logprobs is None:
            return Chunk(text=text, token=token)
        return Chunk(text=text, token=token, logprob=logprobs[0], top_logprobs=logprobs[1])

    def settle(self, room: int, max_tokens: int, counters: dict) -> None:
        """Final stats once generation stopped: whether the context ran out (``room``: the tokens
        it had after the prompt) before ``max_tokens``, and the engine's counters then."""
        self.stats.context_full = (self.finish_reason == "length" and self.stats.generated_tokens == room
                                   < max_tokens)
        self.stats.engine = counters

    def tail(self) -> Chunk | None:
        """The text held back at the end (none after a stop string: what follows it is dropped)."""
        if self._hit:
            return None
        tail, _ = self._stopper.feed(self._decoder.flush())
        tail += self._stopper.flush()
        return Chunk(text=tail, token=None) if tail else None


def count_speculation(stats: GenerationStats, before: dict, after: dict) -> None:
    """The speculative counters of one call: the engine's, after minus before."""
    for name in ("verify_steps", "drafted", "accepted"):
        setattr(stats, name, after[name] - before[name])
    for name in ("drafted_at", "accepted_at"):
        old = before[name] + [0] * (len(after[name]) - len(before[name]))
        setattr(stats, name, [a - b for a, b in zip(after[name], old)])


def count_verify(stats: GenerationStats, drafted: int, accepted: int) -> None:
    """Adds one verify step of ``drafted`` drafts, ``accepted`` of them kept, to ``stats``."""
    stats.verify_steps += 1
    stats.drafted += drafted
    stats.accepted += accepted
    grow = drafted - len(stats.drafted_at)
    if grow > 0:
        stats.drafted_at += [0] * grow
        stats.accepted_at += [0] * grow
    for j in range(drafted):
        stats.drafted_at[j] += 1
        stats.accepted_at[j] += j < accepted


class Runner:
    """The engine's sequences as generation drives them: a prompt resumed from a slot's live
    state or the prefix cache, fed (its snapshots kept in the cache), then decoded plainly or
    speculatively. ``Model.stream`` runs one request on slot 0 with it; a ``batching.Scheduler``
    runs several in the engine's slots. ``engine`` is the ``_core.Engine``."""

    def __init__(self, engine, prefix_cache: PrefixCache | None = None, progress: bool = False):
        self._engine = engine
        self.prefix_cache = prefix_cache
        self.progress = progress  # show prefill progress on stderr

    @property
    def engine(self):
        return self._engine

    @property
    def shared_steps(self):
        """The engine a batching.Scheduler drives (a pipeline's runner gives one that steps across ranks)."""
        return self._engine

    @property
    def max_context(self) -> int:
        return self._engine.max_context

    @property
    def max_sequences(self) -> int:
        return self._engine.max_sequences

    def counters(self) -> dict:
        """The engine's counters (see ``Model.counters``)."""
        return dict(self._engine.counters())

    def last_logprobs(self, slot: int = 0):
        """(logprob, [(id, logprob), ...]) of the token decoded last for ``slot`` when asked for, else None."""
        return self._engine.last_logprobs(slot)

    def resume(self, ids: list[int], boundaries: Sequence[int] = (), slot: int = 0,
               images=None) -> tuple[int, list[int]]:
        """Sets ``slot`` at the longest start of ``ids`` it can resume from: its live
        state, the prefix cache's longest match, else nothing. Returns (tokens reused, the
        positions where feeding the rest should snapshot for the prefix cache). A prompt with
        ``images`` (images.PreparedImages) resumes from the prefix cache only, by its cache_key
        (the live state's ids do not say which pictures it holds)."""
        cached = self._engine.tokens(slot)
        reuse = len(cached) if images is None and 0 < len(cached) < len(ids) and ids[: len(cached)] == cached else 0
        snapshot_at = []
        if self.prefix_cache is not None:
            saved = self.prefix_cache.longest(ids if images is None else images.cache_key(), longer_than=reuse)
            if saved is not None and saved.position > reuse:
                self._engine.restore(slot, saved)
                reuse = saved.position
            snapshot_at = sorted({int(b) for b in boundaries if reuse < b < len(ids)} | {len(ids)})
        if reuse == 0:
            self._engine.reset(slot)
        return reuse, snapshot_at

    def feed_prompt(self, ids: list[int], sampling: dict, boundaries: Sequence[int] = (),
                    constraint: Constraint | None = None, images=None) -> int:
        """Prefills on slot 0 what the cache lacks of ``ids`` (progress on stderr past a second, when
        shown), resuming as ``resume`` does and saving snapshots; returns how many tokens were reused.
        With a ``constraint`` its first mask is written for the token prefill chooses. A prompt with
        ``images`` (images.PreparedImages) resumes and snapshots by its cache_key (see ``resume``)."""
        reuse, snapshot_at = self.resume(ids, boundaries, images=images)
        if constraint is not None:
            constraint.mask(self._engine.token_masks()[0])
        bar = PrefillProgress() if self.progress else None
        taken = []
        extra = {} if images is None else images.engine_args()
        try:
            self._engine.prefill(0, ids[reuse:], _core.Sampling(**sampling), logits="none", progress=bar,
                                 snapshot_at=snapshot_at, snapshots=taken, **extra)
        finally:
            if bar:
                bar.close()
            self.keep(taken, None if images is None else images.cache_key())
        return reuse

    def keep(self, snapshots: list, key=None) -> None:
        """Puts a prompt's snapshots in the prefix cache (a prompt with images: under its cache ``key``)."""
        for snapshot in snapshots:
            self.prefix_cache.add(snapshot, None if key is None else key[:snapshot.position])

    def plain_tokens(self, budget: int, sampling: dict) -> Iterator[int]:
        """Slot 0's next tokens, one decode step each (pipelined on the GPU)."""
        self._engine.decode_begin(0, budget, _core.Sampling(**sampling))
        try:
            while (token := self._engine.decode_next()) is not None:
                yield token
        finally:
            self._engine.decode_end()

    def constrained_tokens(self, budget: int, sampling: dict, constraint: Constraint) -> Iterator[int]:
        """Slot 0's next tokens under a grammar, one step each: the step's forward pass is
        committed, the grammar's next mask computed on the CPU meanwhile and written to the
        slot's mask row, then the masked choice committed (a host decision per token: no
        pipelining, no drafts)."""
        entry = [(0, [], _core.Sampling(**sampling))]
        masks = self._engine.token_masks()
        token = self._engine.chosen(0)  # chosen by prefill under the first mask
        for n in range(budget):
            yield token
            if n + 1 == budget:
                return
            constraint.advance(token)
            token = self._engine.step(entry, before_choice=lambda: constraint.mask(masks[0]))[0][0]

    def speculative_tokens(self, ids: list[int], budget: int, sampling: dict, drafter: spec.Drafter,
                           draft_depth: int) -> Iterator[int]:
        verify = {k: sampling[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
        return spec.generate(self._engine, 0, self._engine.chosen(0), budget, _core.Sampling(**verify), drafter,
                             spec.policy_for(drafter, draft_depth), history=list(ids))
