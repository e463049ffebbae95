"""Several conversations at once (``load(max_sequences=N)``).

A ``Scheduler`` keeps up to N requests in the engine's sequence slots and advances all of
them by one shared step per round (``Engine.step``): their rows stream the weights once, so
N streams cost about what one costs while the weights dominate a step. Requests join and
leave between rounds; a joining prompt is fed in chunks of at most ``prefill_rows`` tokens
per round, so running streams keep going; a cancelled request frees its slot at once. Each
request gets exactly what it gets alone: the same tokens (greedy) and the same seeded draws
(sampling), because every row is computed as in a single-sequence step.

Speculation composes: a request with a drafter verifies its drafts in its slot's rows, and
the rows of a step (at most ``MAX_ROWS``) go first to the requests whose drafts are accepted most.
Shared steps draft by prompt lookup (the MTP head drafts for single-sequence decoding only).

A step the GPU fails (``GpuError``) ends every request whose slot it ran in, with that error
(the engine reset those slots); the other requests go on.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import _core, speculative as spec
from .errors import GpuError
from .generation import Chunk, Generation, Output, Prompt, Request, count_verify

__all__ = ["Scheduler", "Sequence", "MAX_ROWS"]

MAX_ROWS = _core.MAX_STEP_ROWS  # rows of one step on the engine's matvec path (slots plus their drafts)


@dataclass
class Sequence:
    """One request in a Scheduler: its chunks arrive in ``chunks`` as rounds produce them."""

    request: Request
    output: Output
    chunks: list[Chunk] = field(default_factory=list)  # produced and not yet taken (take())
    text: list[str] = field(default_factory=list)  # every chunk's text
    slot: int | None = None  # the engine slot it runs in, while it runs
    finished: bool = False
    cancelled: bool = False
    error: GpuError | None = None  # the GPU failed a step it ran in: it ended with this error
    fed: int = 0  # prompt tokens in the slot's state
    snapshot_at: list[int] = field(default_factory=list)  # prompt positions to snapshot for the prefix cache
    left: int = 0  # tokens it may still generate
    history: list[int] = field(default_factory=list)  # prompt + generated, for the drafter
    policy: spec.DepthPolicy | None = None
    plain: int = 0  # rounds to go without drafts (the policy pausing)
    started: float = 0.0

    @property
    def prefilled(self) -> bool:
        return self.slot is not None and self.fed == len(self.request.ids)

    def take(self) -> list[Chunk]:
        """The chunks produced since the last take."""
        chunks, self.chunks = self.chunks, []
        return chunks

    def generation(self) -> Generation:
        """What it generated; raises its error when a GPU failure ended it."""
        if self.error is not None:
            raise self.error
        return Generation(tokens=list(self.output.tokens), text="".join(self.text),
                          finish_reason=self.output.finish_reason, stats=self.output.stats)

    def _add(self, chunk: Chunk | None) -> None:
        if chunk is not None:
            self.chunks.append(chunk)
            self.text.append(chunk.text)


class Scheduler:
    """Runs requests on one model in shared steps (see the module docstring). Not thread-safe:
    one thread calls submit/cancel/step (the server's engine thread)."""

    def __init__(self, model, prefill_rows: int = 64):
        """``model``: a loaded ``model.Model``; its ``runner`` drives the engine's slots."""
        self.model = model
        self._runner = model.runner
        self._engine = model.runner.engine
        self.prefill_rows = int(prefill_rows)
        self._free = list(range(self._engine.max_sequences))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def submit(self, prompt: Prompt | Request, max_tokens: int = 256, **options) -> Sequence:
        """Queues a request (arguments as ``Model.stream``, checked now; or a ``Model.request``)."""
        request = prompt if isinstance(prompt, Request) else self.model.request(prompt, max_tokens, **options)
        seq = Sequence(request, Output(request, self.model.tokenizer, self.model.eos_token_ids))
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Stops a request now: its slot is free for the next round."""
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq)

    def step(self) -> list[Sequence]:
        """One round: admit waiting requests to free slots, feed one prompt chunk, then one
        shared step for every request past its prompt. Returns the requests that produced
        chunks or finished."""
        touched: list[Sequence] = []
        while self.waiting and self._free:
            seq = self.waiting.popleft()
            with self._failing([seq], touched):
                self._admit(seq)
        feeding = next((s for s in self.running if not s.prefilled), None)
        if feeding is not None:
            with self._failing([feeding], touched):
                if self._feed(feeding):
                    touched.append(feeding)
        decoding = [s for s in self.running if s.prefilled and not s.finished]
        if decoding:
            with self._failing(decoding, touched):
                self._decode(decoding)
            touched += [s for s in decoding if s not in touched]
        return touched

    def run(self) -> None:
        """Rounds until every request finished."""
        while self.busy:
            self.step()

    # ----------------------------------------------------------------------------- internals

    @contextmanager
    def _failing(self, seqs: list[Sequence], touched: list[Sequence]):
        """A GpuError inside ends ``seqs`` with it (the engine reset their slots: nothing of theirs goes on)."""
        try:
            yield
        except GpuError as e:
            for seq in seqs:
                seq.error = e
                self._finish(seq)
                if seq not in touched:
                    touched.append(seq)

    def _admit(self, seq: Sequence) -> None:
        """Into the free slot whose live tokens this prompt extends furthest (else the first free)."""
        ids = seq.request.ids

        def reusable(slot: int) -> int:
            cached = self._engine.tokens(slot)
            return len(cached) if len(cached) < len(ids) and ids[: len(cached)] == cached else 0

        seq.slot = max(self._free, key=reusable)
        self._free.remove(seq.slot)
        self.running.append(seq)
        seq.fed, seq.snapshot_at = self._runner.resume(ids, seq.request.boundaries, seq.slot)
        seq.output.stats.prompt_tokens_reused = seq.fed
        room = self._runner.max_context - len(ids)
        seq.left = min(seq.request.max_tokens, room)
        seq.history = list(ids)
        if seq.request.drafter is not None:
            seq.policy = spec.DepthPolicy(self.model.draft_depth)

    def _feed(self, seq: Sequence) -> bool:
        """Feeds the next chunk of a prompt; after the last, takes its first token. True when it produced one."""
        ids, stats = seq.request.ids, seq.output.stats
        end = min(len(ids), seq.fed + self.prefill_rows)
        start = time.perf_counter()
        taken = []
        at = [p for p in seq.snapshot_at if seq.fed < p <= end]
        self._engine.prefill(seq.slot, ids[seq.fed:end], _core.Sampling(**seq.request.sampling), logits="none",
                             snapshot_at=at, snapshots=taken)
        for snapshot in taken:
            self._runner.prefix_cache.add(snapshot)
        stats.prompt_seconds += time.perf_counter() - start
        seq.fed = end
        if end < len(ids):
            return False
        seq.started = time.perf_counter()
        self._emit(seq, [self._engine.chosen(seq.slot)])
        return True

    def _decode(self, seqs: list[Sequence]) -> None:
        """One shared step for ``seqs`` (each past its prompt), drafts where they pay."""
        drafts = self._drafts(seqs)
        # A drafting request has neither penalties nor logprobs (Model.request turns its drafter off).
        entries = [(s.slot, drafts[id(s)], _core.Sampling(**s.request.sampling)) for s in seqs]
        results = self._engine.step(entries)
        for seq, tokens in zip(seqs, results):
            k = len(drafts[id(seq)])
            if k:
                seq.policy.update(k, len(tokens) - 1)
                count_verify(seq.output.stats, k, len(tokens) - 1)
            self._emit(seq, tokens)

    def _drafts(self, seqs: list[Sequence]) -> dict[int, list[int]]:
        """Drafts per request within the step's rows: one row each, the rest to the requests
        whose policies expect the most from their drafts."""
        spare = MAX_ROWS - len(seqs)
        out = {id(s): [] for s in seqs}
        speculating = [s for s in seqs if s.policy is not None and s.left > 1]
        for seq in sorted(speculating, key=lambda s: s.policy.speedup(1), reverse=True):
            if spare <= 0:
                break
            if seq.plain > 0:
                seq.plain -= 1
                continue
            k = min(seq.policy.depth(), seq.left - 1, spare)
            drafter = seq.request.drafter
            if isinstance(drafter, spec.MtpHead):
                drafter = drafter.lookup
            found = drafter.draft(seq.history, k)[:k] if k > 0 else []
            if not found:
                seq.plain = seq.policy.plain_tokens() - 1
                continue
            out[id(seq)] = found
            spare -= len(found)
        return out

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        """Hands generated tokens to the request's output; finishes it at a stop or its budget."""
        logprobs = None
        if seq.request.sampling["logprobs"] >= 0:  # then one token (no drafts), its logprobs in its slot
            logprobs = self._engine.last_logprobs(seq.slot)
        for token in tokens:
            seq.history.append(token)
            seq.left -= 1
            seq._add(seq.output.add(token, logprobs))
            if seq.output.done or seq.left == 0:
                break
        if seq.output.done or seq.left == 0:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        if seq.finished:
            return
        seq.finished = True
        stats = seq.output.stats
        if seq.started:
            stats.decode_seconds = time.perf_counter() - seq.started
        seq.output.settle(self._runner.max_context - len(seq.request.ids), seq.request.max_tokens,
                          self._runner.counters())
        if not seq.cancelled and seq.error is None:
            seq._add(seq.output.tail())
        if seq in self.running:
            self.running.remove(seq)
            self._free.append(seq.slot)
            self._free.sort()
