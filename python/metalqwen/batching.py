"""Several conversations at once (``load(max_sequences=N)``).

A ``Scheduler`` keeps up to N requests in the engine's sequence slots and advances all of
them by one shared step per round (``Engine.step``): their rows stream the weights once, so
N streams cost about what one costs while the weights dominate a step. Requests join and
leave between rounds; a joining prompt is fed in chunks of at most ``prefill_rows`` tokens
per round, each chunk rows of the same shared step as the running streams (``Engine.step``'s
``prompt``: prefill rows on the GEMM path, then the others' rows on the matvec path, in one
command buffer), so they keep producing a token every round while a long prompt is read; a
cancelled request frees its slot at once. Each
request gets exactly what it gets alone: the same tokens (greedy) and the same seeded draws
(sampling), because every row is computed as in a single-sequence step.

Shared steps are pipelined as single-sequence decoding is: while every request is decoding
without drafts or a grammar and none joins, the next step is committed before the current one
is waited for (``Engine.step_commit`` / ``step_wait``): each row reads the token the GPU chose
for it, so the host waits once per step and the GPU never waits for it. A host decision (a
joining prompt, drafts, a grammar's mask) waits for the steps in flight and runs a step
synchronously. A request that stops (eos, a stop string) while its next step is in flight
drops that step's token; its slot's state keeps the token it fed (``Engine.tokens`` tells).

Speculation composes: a request with a drafter verifies its drafts in its slot's rows, and
the rows of a step (at most ``Engine.max_step_rows``) go first to the requests whose drafts are accepted most.
With the MTP head, each such request drafts its own greedy chain on the GPU in the step's
command buffer (``Engine.step``'s MTP entries), as single-sequence MTP steps do; prompt lookup
takes over on a quoted span. While a request's drafter pauses (its drafts were not paying),
its steps are pipelined.

Grammars compose: a constrained request (``json_schema=``, ``grammar=``, ``response_format=``)
takes no drafts; in a step with such requests their masks are computed together on the CPU
(llguidance's thread pool) while the GPU runs the step's forward pass, and their choices follow
in a second command buffer (``Engine.step``'s ``before_choice``).

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

# Rows of one step on the engine's matvec path (slots plus their drafts) at most; an engine's own
# limit is Engine.max_step_rows (SMALL_STEP_ROWS unless loaded with draft_depth >= SMALL_STEP_ROWS).
MAX_ROWS = _core.MAX_STEP_ROWS


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
    pending: int = 0  # its rows in steps committed and not yet waited for (a token each)
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
        self._engine = model.runner.shared_steps
        self.prefill_rows = int(prefill_rows)
        self._free = list(range(self._engine.max_sequences))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._in_flight: deque[list[Sequence]] = deque()  # the requests of each step committed, oldest first

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self._in_flight)

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
        """One round: admit waiting requests to free slots, then one shared step for every
        request past its prompt, with one chunk of a joining prompt among its rows (alone, as a
        prefill, when nothing else runs). Returns the requests that produced chunks or finished."""
        touched: list[Sequence] = []
        joining = (self.waiting and self._free) or any(not s.prefilled for s in self.running)
        if joining:  # a slot changes hands or a prompt is fed: after the steps in flight
            self._settle(touched)
        while self.waiting and self._free:
            seq = self.waiting.popleft()
            with self._failing([seq], touched):
                self._admit(seq)
        feeding = next((s for s in self.running if not s.prefilled), None)
        decoding = [s for s in self.running if s.prefilled and not s.finished]
        if feeding is not None and not decoding:  # nothing runs beside it: its chunk as prefill, alone
            with self._failing([feeding], touched):
                if self._feed(feeding):
                    touched.append(feeding)
            feeding = None
            decoding = [s for s in self.running if s.prefilled and not s.finished]
        if feeding is not None:  # its chunk joins the decoding requests' step (nothing is in flight)
            produced = False  # stays so when the step fails (_failing ends its requests)
            with self._failing([*decoding, feeding], touched):
                produced = self._decode(decoding, feeding)
            touched += [s for s in decoding if s not in touched]
            if produced and feeding not in touched:
                touched.append(feeding)
        elif decoding and not any(self._needs_host(s) for s in decoding):
            self._pipeline(decoding, touched)
        elif decoding:
            self._settle(touched)
            decoding = [s for s in decoding if not s.finished]
            if decoding:
                with self._failing(decoding, touched):
                    self._decode(decoding)
                touched += [s for s in decoding if s not in touched]
        else:
            self._settle(touched)
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

    def _needs_host(self, seq: Sequence) -> bool:
        """Whether its next step needs the tokens before it on the host: a grammar's mask, or drafts."""
        drafting = seq.policy is not None and seq.plain == 0 and seq.left - seq.pending > 1
        return seq.request.constraint is not None or drafting

    def _pipeline(self, seqs: list[Sequence], touched: list[Sequence]) -> None:
        """Commits the next step of ``seqs`` (those with tokens left after the ones in flight),
        then waits for the oldest step when another is queued behind it (or nothing was)."""
        rows = [s for s in seqs if s.left - s.pending > 0]
        if rows:
            with self._failing(rows, touched):
                self._engine.step_commit([(s.slot, [], _core.Sampling(**s.request.sampling)) for s in rows])
                self._in_flight.append(rows)
                for seq in rows:
                    seq.pending += 1
                    if seq.plain > 0:  # the drafter's pause counts these steps
                        seq.plain -= 1
        if len(self._in_flight) > 1 or (self._in_flight and not rows):
            self._wait_oldest(touched)

    def _wait_oldest(self, touched: list[Sequence]) -> None:
        """The oldest step in flight's tokens to its requests (a request that stopped since drops its token)."""
        seqs = self._in_flight.popleft()
        try:
            results = self._engine.step_wait()
        except GpuError:
            # The engine reset the slots of every step in flight: their requests end with the error.
            failed = list({id(s): s for step in [seqs, *self._in_flight] for s in step}.values())
            self._in_flight.clear()
            for seq in failed:
                seq.pending = 0
            with self._failing(failed, touched):
                raise
            return
        for seq, tokens in zip(seqs, results):
            seq.pending -= 1
            if not seq.finished:
                self._emit(seq, tokens)
                if seq not in touched:
                    touched.append(seq)

    def _settle(self, touched: list[Sequence]) -> None:
        """Waits for every step in flight, handing out their tokens."""
        while self._in_flight:
            self._wait_oldest(touched)

    def _admit(self, seq: Sequence) -> None:
        """Into the free slot whose live tokens this prompt extends furthest (else the first free)."""
        ids = seq.request.ids

        def reusable(slot: int) -> int:
            cached = self._engine.tokens(slot)
            return len(cached) if len(cached) < len(ids) and ids[: len(cached)] == cached else 0

        seq.slot = max(self._free, key=reusable)
        self._free.remove(seq.slot)
        self.running.append(seq)
        seq.fed, seq.snapshot_at = self._runner.resume(ids, seq.request.boundaries, seq.slot, seq.request.images)
        seq.output.stats.prompt_tokens_reused = seq.fed
        room = self._runner.max_context - len(ids)
        seq.left = min(seq.request.max_tokens, room)
        seq.history = list(ids)
        if seq.request.drafter is not None:
            seq.policy = spec.policy_for(seq.request.drafter, self.model.draft_depth)
        if seq.request.constraint is not None:  # the first token's mask, read by the prompt's last chunk
            seq.request.constraint.mask(self._engine.token_masks()[seq.slot])

    def _feed(self, seq: Sequence) -> bool:
        """Feeds the next chunk of a prompt; after the last, takes its first token. True when it produced one."""
        ids, stats = seq.request.ids, seq.output.stats
        end = min(len(ids), seq.fed + self.prefill_rows)
        start = time.perf_counter()
        taken = []
        at = [p for p in seq.snapshot_at if seq.fed < p <= end]
        images = seq.request.images
        self._engine.prefill(seq.slot, ids[seq.fed:end], _core.Sampling(**seq.request.sampling), logits="none",
                             snapshot_at=at, snapshots=taken, **(images.engine_args() if images else {}))
        self._keep(seq, taken)
        stats.prompt_seconds += time.perf_counter() - start
        seq.fed = end
        if end < len(ids):
            return False
        seq.started = time.perf_counter()
        self._emit(seq, [self._engine.chosen(seq.slot)])
        return True

    def _keep(self, seq: Sequence, snapshots: list) -> None:
        """Puts a prompt's snapshots in the prefix cache (a prompt with images: under its cache_key)."""
        self._runner.keep(snapshots, seq.request.images.cache_key() if seq.request.images is not None else None)

    def _chunk(self, seq: Sequence) -> tuple[int, bool]:
        """The end of the prompt's next chunk (at most ``prefill_rows`` and the engine's ``max_rows``
        tokens, ending at the next snapshot position) and whether the state there is snapshotted."""
        end = min(len(seq.request.ids), seq.fed + self.prefill_rows, seq.fed + self._engine.max_rows)
        end = min([p for p in seq.snapshot_at if p > seq.fed] + [end])
        return end, end in seq.snapshot_at

    def _decode(self, seqs: list[Sequence], feeding: Sequence | None = None) -> bool:
        """One shared step for ``seqs`` (each past its prompt), drafts where they pay; with the next
        chunk of ``feeding``'s prompt among its rows. True when that chunk was its last (it produced
        its first token)."""
        prompt, taken, end = None, [], 0
        if feeding is not None:
            end, snapshot = self._chunk(feeding)
            ids = feeding.request.ids
            prompt = (feeding.slot, ids[feeding.fed:end], _core.Sampling(**feeding.request.sampling),
                      end == len(ids), snapshot)
            if feeding.request.images is not None:
                prompt += (feeding.request.images.rope_positions, feeding.request.images.features)
        start = time.perf_counter()
        drafts, heads = self._drafts(seqs)
        # A drafting request has neither penalties nor logprobs (Model.request turns its drafter off).
        entries = [(s.slot, drafts[id(s)], _core.Sampling(**s.request.sampling), heads.get(id(s), 0)) for s in seqs]
        # The MTP drafts a step makes: those asked, where the head's state exists (else it is rebuilt).
        made = {id(s): heads.get(id(s), 0) if self._engine.mtp_ready(s.slot) else 0 for s in seqs}
        results = self._engine.step(entries, before_choice=self._masks([s for s in seqs if s.request.constraint]),
                                    prompt=prompt, snapshots=taken)
        for seq, tokens in zip(seqs, results):
            k = len(drafts[id(seq)]) or made[id(seq)]
            if k:
                seq.policy.update(k, len(tokens) - 1)
                count_verify(seq.output.stats, k, len(tokens) - 1)
            self._emit(seq, tokens)
        if feeding is None:
            return False
        self._keep(feeding, taken)
        feeding.output.stats.prompt_seconds += time.perf_counter() - start  # the step that read its chunk
        feeding.fed = end
        if end < len(feeding.request.ids):
            return False
        feeding.started = time.perf_counter()
        self._emit(feeding, results[-1])
        return True

    def _masks(self, constrained: list[Sequence]):
        """The step's before_choice for its constrained requests (None without any): their last
        token advances each grammar now, the masks are computed while the GPU runs the step."""
        if not constrained:
            return None
        from .constraints import fill_masks

        for seq in constrained:
            seq.request.constraint.advance(seq.history[-1])  # the token this step feeds
        masks = self._engine.token_masks()
        return lambda: fill_masks([(s.request.constraint, s.slot) for s in constrained], masks)

    def _drafts(self, seqs: list[Sequence]) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Drafts per request within the step's rows: one row each, the rest to the requests
        whose policies expect the most from their drafts. Returns the host's drafts and the
        MTP drafts asked of the engine (by ``id`` of the request)."""
        spare = self._engine.max_step_rows - len(seqs)
        out = {id(s): [] for s in seqs}
        heads: dict[int, int] = {}
        speculating = [s for s in seqs if s.policy is not None and s.left > 1]
        for seq in sorted(speculating, key=lambda s: s.policy.speedup(1), reverse=True):
            if spare <= 0:
                break
            if seq.plain > 0:
                seq.plain -= 1
                continue
            k = min(seq.policy.depth(), seq.left - 1, spare)
            drafter = seq.request.drafter
            found = drafter.draft(seq.history, k)[:k] if k > 0 else []
            if isinstance(drafter, spec.MtpHead) and not found and k > 0:
                heads[id(seq)] = k  # the head drafts on the GPU (or, without its state, the step rebuilds it)
                spare -= k if self._engine.mtp_ready(seq.slot) else 0
                continue
            if not found:
                seq.plain = seq.policy.plain_tokens() - 1
                continue
            out[id(seq)] = found
            spare -= len(found)
        return out, heads

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
