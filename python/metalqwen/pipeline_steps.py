"""Several sequences in shared steps across ranks: the engine a ``batching.Scheduler`` drives on
each rank of a pipeline (``PipelineRunner.shared_steps``).

Every rank runs the same Scheduler with the same requests: its decisions (admissions, prompt
chunks, drafts, stops) depend only on the tokens, which every rank gets, so they are the same
on every rank. Each of its engine calls runs across the ranks here: a shared step's rows (each
entry's 1 + drafts rows, then the prompt chunk's) go from rank to rank through
``Engine.step_rows``, the last rank's engine chooses and accepts as alone, and its outcome
comes back to every rank (the other engines take it with ``Engine.step_accept``). Drafts are
the host's (prompt lookup): MTP entries are refused across ranks."""

from __future__ import annotations

from collections import deque

import numpy as np

from . import _core
from .errors import EngineError

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

    def __getattr__(self, name):  # max_sequences, max_context, max_rows, tokens, chosen, token_masks, ...
        return getattr(self._engine, name)

    def mtp_ready(self, slot: int) -> bool:
        return False  # no MTP entries across ranks: the Scheduler never asks the head

    def last_logprobs(self, slot: int):
        return self._logprobs.get(slot)

    def prefill(self, slot: int, ids, sampling, logits: str = "none", snapshot_at=(), snapshots=None):
        """A prompt's part alone (nothing else runs), chunk by chunk along the ranks."""
        self._runner.prefill_slot(slot, list(ids), sampling, snapshot_at, snapshots)
        self._logprobs[slot] = self._runner.last_logprobs(slot)

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
        for entry in entries:
            if len(entry) > 3 and entry[3]:
                raise EngineError(f"[distributed] slot {entry[0]}: MTP drafts in a shared step across ranks are "
                                  "not supported (speculative='lookup' or 'off')")
        rows = sum(1 + len(entry[1]) for entry in entries) + (len(prompt[1]) if prompt is not None else 0)
        if not engine.embeds:
            engine.step_rows()[:rows] = runner.rows_in(rows)
        got = engine.step(entries, before_choice=before_choice if engine.has_head else None, prompt=prompt,
                          snapshots=snapshots)
        if not engine.has_head:
            runner.rows_out(engine.step_rows()[:rows])
        return self._outcome(entries, prompt, got)

    def _outcome(self, entries, prompt, got: list[list[int]]) -> list[list[int]]:
        """The last rank's tokens per entry (accepted drafts, next token) and the prompt chunk's
        (its first token after the last chunk), with their logprobs, on every rank; the other
        engines take them (step_accept). int32 [(entries + 1) * _ENTRY]."""
        engine = self._engine
        slots = [entry[0] for entry in entries] + [prompt[0] if prompt is not None else -1]
        size = len(slots) * _ENTRY
        mine = None
        if engine.has_head:
            mine = np.zeros(size, dtype=np.int32)
            mine[1::_ENTRY] = -1
            for i, tokens in enumerate(got):
                if tokens:
                    mine[i * _ENTRY:i * _ENTRY + 2] = len(tokens) - 1, tokens[-1]
                    found = engine.last_logprobs(slots[i])
                    if found is not None:
                        pack_logprobs(mine[i * _ENTRY + 2:(i + 1) * _ENTRY], *found)
        shared = self._group.share(mine, self._group.size - 1, (size,), np.int32, "sharing a shared step's tokens")
        out, outcomes = [], []
        for i, slot in enumerate(slots):
            accepted, token = int(shared[i * _ENTRY]), int(shared[i * _ENTRY + 1])
            if slot < 0:
                break
            if i < len(entries):
                outcomes.append((slot, accepted, token))
            out.append(list(entries[i][1][:accepted]) + [token] if i < len(entries) else [token] if token >= 0 else [])
            self._logprobs[slot] = unpack_logprobs(shared[i * _ENTRY + 2:(i + 1) * _ENTRY])
        first = int(shared[-_ENTRY + 1])
        if not engine.has_head:
            engine.step_accept(outcomes, prompt_token=first if prompt is not None and first >= 0 else None)
        return out


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
