"""Several sequences in shared steps across ranks: the engine a ``batching.Scheduler`` drives on
each rank of a pipeline (``PipelineRunner.shared_steps``).

Every rank runs the same Scheduler with the same requests: its decisions (admissions, prompt
chunks, drafts, stops) depend only on the tokens, which every rank gets, so they are the same
on every rank. Each of its engine calls runs across the ranks here: a shared step's rows (each
entry's 1 + drafts rows, then the prompt chunk's) go from rank to rank through
``Engine.step_rows``, the last rank's engine chooses and accepts as alone, and its outcome
comes back to every rank (the other engines take it with ``Engine.step_accept``). Drafts are
the host's (prompt lookup), or the MTP head's: rank 0 must embed them, so the last rank makes
each head-drafting slot's next chain after the slot's step (``Engine.mtp_drafts``, depth
``mtp_depth``) and they come back with the outcome; the next MTP entry feeds the first
``mtp_drafts`` of them, the drafts one process's step would make on the GPU."""

from __future__ import annotations

from collections import deque

import numpy as np

from . import _core

# int32 words of one entry's outcome: accepted drafts, next token (-1: none), then its logprobs
# (pack_logprobs, MAX_TOP_LOGPROBS wide).
_ENTRY = 2 + 2 + 2 * _core.MAX_TOP_LOGPROBS


class RankSteps:
    """The engine calls of a Scheduler on one rank of a pipeline (``runner``: its PipelineRunner):
    steps and prefills across the ranks, everything else this rank's engine's."""

    def __init__(self, runner):
        self._runner = runner
        self._engine = runner.engine
        self._group = runner.group
        self._done: deque[tuple] = deque()  # step_commit's results and logprobs, for step_wait
        self._logprobs: dict[int, tuple | None] = {}  # per slot: of the token shared last
        self._depth = runner.mtp_depth  # drafts the head makes ahead (0: no head)
        self._ready: dict[int, bool] = {}  # per slot: the last rank's mtp_ready, shared
        self._ahead: dict[int, list[int]] = {}  # per slot: the head's drafts made after its last step
        self._heads: set[int] = set()  # slots whose request drafts with the head (an MTP entry since its prompt)

    def __getattr__(self, name):  # max_sequences, max_context, max_rows, tokens, chosen, token_masks, ...
        return getattr(self._engine, name)

    def mtp_ready(self, slot: int) -> bool:
        return self._ready.get(slot, False)

    def last_logprobs(self, slot: int):
        return self._logprobs.get(slot)

    def prefill(self, slot: int, ids, sampling, logits: str = "none", snapshot_at=(), snapshots=None):
        """A prompt's part alone (nothing else runs), chunk by chunk along the ranks."""
        self._new_prompt(slot)
        self._runner.prefill_slot(slot, list(ids), sampling, snapshot_at, snapshots)
        self._logprobs[slot] = self._runner.last_logprobs(slot)
        self._ready[slot] = self._depth > 0  # the last chunk runs the head (when loaded) for the first drafts

    @property
    def steps_in_flight(self) -> int:
        return len(self._done)

    def step_commit(self, entries) -> None:
        """Across ranks each step waits for the rows before it: run now, handed out by step_wait
        (with its logprobs: the Scheduler reads them once it has waited)."""
        got = self.step(entries)
        self._done.append((got, dict(self._logprobs)))

    def step_wait(self) -> list[list[int]]:
        got, self._logprobs = self._done.popleft()
        return got

    def step(self, entries, before_choice=None, prompt=None, snapshots=None) -> list[list[int]]:
        """Engine.step across the ranks: the same result on every rank (``before_choice`` writes the
        masks the last rank's choices read)."""
        engine, runner = self._engine, self._runner
        if prompt is not None:
            self._new_prompt(prompt[0])
        entries = self._with_head_drafts(entries)
        rows = sum(1 + len(entry[1]) for entry in entries) + (len(prompt[1]) if prompt is not None else 0)
        if not engine.embeds:
            engine.step_rows()[:rows] = runner.rows_in(rows)
        mine = entries if engine.has_head else [entry[:3] for entry in entries]  # MTP entries: the head's engine's
        got = engine.step(mine, before_choice=before_choice if engine.has_head else None, prompt=prompt,
                          snapshots=snapshots)
        if not engine.has_head:
            runner.rows_out(engine.step_rows()[:rows])
        return self._outcome(entries, prompt, got)

    def _new_prompt(self, slot: int) -> None:
        """A new request's prompt goes into ``slot``: whether it drafts with the head shows in its entries."""
        self._heads.discard(slot)
        self._ahead.pop(slot, None)

    def _with_head_drafts(self, entries) -> list[tuple]:
        """The entries with their MTP drafts (entry[3]) as the drafts they feed: the first of those
        made ahead when the slot's head state exists (else none: one row, which makes it). The
        first MTP entry after a prompt has none made ahead: the last rank drafts for it now."""
        now = [(entry[0], entry[3]) for entry in entries
               if len(entry) > 3 and entry[3] and self.mtp_ready(entry[0]) and entry[0] not in self._ahead]
        if now:
            self._share_drafts_now(now)
        out = []
        for entry in entries:
            if len(entry) > 3 and entry[3]:
                slot, asked = entry[0], entry[3]
                self._heads.add(slot)
                out.append((slot, self._ahead[slot][:asked] if self.mtp_ready(slot) else [], entry[2], asked))
            else:
                out.append(tuple(entry))
        return out

    def _share_drafts_now(self, wanted: list[tuple[int, int]]) -> None:
        """The last rank's head drafts ``k`` for each (slot, k) before the step, on every rank
        (int32 [sum of k])."""
        engine = self._engine
        mine = np.array([t for slot, k in wanted for t in engine.mtp_drafts(slot, k)], dtype=np.int32) \
            if engine.has_head else None
        drafts = self._group.share(mine, self._group.size - 1, (sum(k for _, k in wanted),), np.int32,
                                   "sharing the MTP head's drafts")
        at = 0
        for slot, k in wanted:
            self._ahead[slot] = [int(t) for t in drafts[at:at + k]]
            at += k

    def _outcome(self, entries, prompt, got: list[list[int]]) -> list[list[int]]:
        """The last rank's tokens per entry (accepted drafts, next token) and the prompt chunk's
        (its first token after the last chunk), with their logprobs, and the head's drafts for each
        slot's next step, on every rank; the other engines take them (step_accept).
        int32 [(entries + 1) * (_ENTRY + head)], head: 1 + mtp_depth words (with the head)."""
        engine = self._engine
        slots = [entry[0] for entry in entries] + [prompt[0] if prompt is not None else -1]
        width = _ENTRY + (1 + self._depth if self._depth else 0)
        size = len(slots) * width
        mine = None
        if engine.has_head:
            mine = np.zeros(size, dtype=np.int32)
            mine[1::width] = -1
            for i, tokens in enumerate(got):
                if tokens:
                    mine[i * width:i * width + 2] = len(tokens) - 1, tokens[-1]
                    found = engine.last_logprobs(slots[i])
                    if found is not None:
                        pack_logprobs(mine[i * width + 2:i * width + _ENTRY], *found)
            if self._depth:
                for i, slot in enumerate(slots):
                    if slot >= 0:
                        self._head_words(mine[i * width + _ENTRY:(i + 1) * width], slot)
        shared = self._group.share(mine, self._group.size - 1, (size,), np.int32, "sharing a shared step's tokens")
        out, outcomes = [], []
        for i, slot in enumerate(slots):
            accepted, token = int(shared[i * width]), int(shared[i * width + 1])
            if slot < 0:
                break
            if i < len(entries):
                outcomes.append((slot, accepted, token))
            out.append(list(entries[i][1][:accepted]) + [token] if i < len(entries) else [token] if token >= 0 else [])
            self._logprobs[slot] = unpack_logprobs(shared[i * width + 2:i * width + _ENTRY])
            if self._depth:
                made = int(shared[i * width + _ENTRY])
                self._ready[slot] = made >= 0
                self._ahead.pop(slot, None)
                if made > 0:
                    self._ahead[slot] = [int(t) for t in shared[i * width + _ENTRY + 1:][:made]]
        first = int(shared[len(entries) * width + 1])
        if not engine.has_head:
            engine.step_accept(outcomes, prompt_token=first if prompt is not None and first >= 0 else None)
        return out

    def _head_words(self, words: np.ndarray, slot: int) -> None:
        """The last rank, after a step: words int32 [1 + mtp_depth] of the slot: -1 without the
        head's state, else the number of drafts the head made ahead (a slot drafting with it:
        mtp_depth within the context) and them."""
        engine = self._engine
        if not engine.mtp_ready(slot):
            words[0] = -1
            return
        room = max(0, engine.max_context - engine.position(slot) - 2)  # as the verify step that feeds them
        made = engine.mtp_drafts(slot, min(self._depth, room)) if slot in self._heads else []
        words[0], words[1:1 + len(made)] = len(made), made


def pack_logprobs(words: np.ndarray, logprob: float, top: list) -> None:
    """A chosen token's logprob and ``top`` entries into words int32 [2 + 2 * width]: 1 + their
    count (0: none), the logprob's float32 bits, then width ids and width logprobs' bits."""
    width = (words.size - 2) // 2
    words[0] = 1 + len(top)
    words[1] = np.array([logprob], dtype=np.float32).view(np.int32)[0]
    words[2:2 + len(top)] = [i for i, _ in top]
    words[2 + width:2 + width + len(top)] = np.array([v for _, v in top], dtype=np.float32).view(np.int32)


def unpack_logprobs(words: np.ndarray) -> tuple | None:
    """(logprob, [(id, logprob)]) from pack_logprobs' words, or None."""
    if words[0] == 0:
        return None
    width, n, values = (words.size - 2) // 2, int(words[0]) - 1, words.view(np.float32)
    return float(values[1]), [(int(i), float(v)) for i, v in zip(words[2:2 + n], values[2 + width:2 + width + n])]
