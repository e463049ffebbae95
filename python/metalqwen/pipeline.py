"""Pipeline parallelism: one model over the ranks ``mlx.launch`` starts (several Macs, or
processes on one machine), each rank's engine running a contiguous range of layers.

Rank 0 embeds the tokens; each step's residual rows (hidden x 4 bytes per row) go from rank to
rank; the last rank holds the final norm, lm_head and sampler, and shares its choice (and the
logits ``score`` asks for) with every rank. Every rank makes the same calls in the same order
(``load(..., distributed="pipeline")``, then ``generate``/``stream``/``score``) and gets the same
result; each call's arguments are compared across ranks first (``pipeline_model.PipelineModel``). See
docs/distributed.md."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from . import _core
from .checkpoint import Checkpoint
from .distributed import LOAD_TIMEOUT, Group
from .errors import DistributedError
from . import speculative as spec
from .generation import Runner
from .pipeline_steps import RankSteps, pack_logprobs, unpack_logprobs

# Shown when a call asks for what this stage does not run across ranks.
NOT_YET = "mtp_logits, DFlash drafters (draft) and images"

Split = list[tuple[int, int]]  # per rank: layers [first, end)


class RankPart(NamedTuple):
    """What ``load_rank`` gives a rank: its part of the model and the group."""
    checkpoint: Checkpoint
    tokenizer: Any
    device: Any
    engine: Any  # _core.Engine of this rank's layers (the last rank's with the MTP head, when loaded)
    group: Group
    split: Split
    speculative: str  # "mtp" | "lookup" | "off"
    draft_depth: int  # drafts per verify step at most (0 when "off")
    mtp: bool  # whether the MTP head was loaded (by the last rank)


# ---- the layer split

def format_split(split: Split) -> str:
    return ",".join(f"{first}:{end}" for first, end in split)


def parse_split(text: str, layers: int, ranks: int) -> Split:
    """``"0:20,20:40"`` -> [(0, 20), (20, 40)]: one range per rank, in rank order, together
    covering layers 0..layers-1 once. ValueError naming what is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"layer_split must be a string such as '0:20,20:40', got {type(text).__name__}")
    split: Split = []
    for part in text.split(","):
        bounds = part.strip().split(":")
        if len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
            raise ValueError(f"[distributed] layer_split {text!r}: {part.strip()!r} is not first:end (e.g. 0:20)")
        split.append((int(bounds[0]), int(bounds[1])))
    if len(split) != ranks:
        raise ValueError(f"[distributed] layer_split {text!r} has {len(split)} ranges for {ranks} ranks")
    expected = 0
    for rank, (first, end) in enumerate(split):
        if first != expected or end <= first:
            raise ValueError(f"[distributed] layer_split {text!r}: rank {rank}'s range {first}:{end} must start at "
                             f"layer {expected} and hold at least one layer (the ranges cover the {layers} layers "
                             "in order)")
        expected = end
    if expected != layers:
        raise ValueError(f"[distributed] layer_split {text!r} ends at layer {expected}, but the model has {layers} "
                         "layers")
    return split


def proportional_split(layer_bytes: Sequence[int], memory: Sequence[int]) -> Split:
    """Contiguous ranges whose weight bytes are about proportional to each rank's ``memory``,
    at least one layer each (equal memories: an even split by bytes)."""
    layers, ranks = len(layer_bytes), len(memory)
    if ranks > layers:
        raise ValueError(f"[distributed] {ranks} ranks for {layers} layers: each rank needs at least one layer")
    cumulative = np.concatenate([[0], np.cumsum(np.asarray(layer_bytes, dtype=np.float64))])
    shares = np.cumsum(np.asarray(memory, dtype=np.float64)) / float(sum(memory))
    bounds = [0]
    for rank in range(1, ranks):
        target = cumulative[-1] * shares[rank - 1]
        low, high = bounds[-1] + 1, layers - (ranks - rank)
        bounds.append(int(min(range(low, high + 1), key=lambda b: abs(cumulative[b] - target))))
    bounds.append(layers)
    return [(bounds[r], bounds[r + 1]) for r in range(ranks)]


def layer_bytes(desc: dict) -> list[int]:
    """Bytes of each layer's tensors in the checkpoint (``Checkpoint.describe``)."""
    return [sum(entry[2] for entry in layer["tensors"].values()) for layer in desc["layers"]]


def check_fits(split: Split, needs: Sequence[dict], memory: Sequence[int]) -> None:
    """ValueError naming the first rank whose range (``needs``: _core.estimate_memory) exceeds its memory."""
    for rank, ((first, end), need, limit) in enumerate(zip(split, needs, memory)):
        if need["total"] > limit:
            raise ValueError(
                f"[distributed] layer split {format_split(split)}: rank {rank} (layers {first}:{end}) needs "
                f"{need['total']} bytes (weights {need['weights']} + KV cache {need['kv_cache']} + workspace "
                f"{need['workspace']}) but its GPU may use {limit} bytes: give it fewer layers (layer_split), "
                "add a rank or lower max_context")


# ---- agreeing across ranks

def digest(*parts) -> bytes:
    """sha256 of ``parts`` (JSON-able, else by repr)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).digest()


def model_identity(ckpt: Checkpoint) -> bytes:
    """A digest of the model a rank loads: its config and every tensor's place, type and shape
    (the MTP head's too) in shards of the same sizes (not the weights' bytes: reading 100s of GB
    would take minutes)."""
    desc = ckpt.describe()
    files = {f["path"]: f["size"] for f in desc["files"]}
    tensors = {name: (os.path.basename(e[0]), files.get(e[0]), *e[1:])
               for name, e in {**desc["tensors"], **desc["mtp"]}.items()}
    return digest(desc["dims"], tensors)


def agree(group: Group, what: str, value: bytes) -> None:
    """DistributedError on every rank unless all ranks give the same ``value`` (a digest) for ``what``."""
    seen = group.all_gather(np.frombuffer(value, dtype=np.uint8), f"comparing {what}")
    differ = [r for r in range(group.size) if not np.array_equal(seen[r], seen[0])]
    if differ:
        raise DistributedError(f"[distributed] rank {group.rank}: rank{'s' if len(differ) > 1 else ''} "
                               f"{', '.join(map(str, differ))} differ from rank 0 in {what}")


# ---- running steps across ranks

# The last float of a rows message: go on with the step, or stop (rank 0 ended the generation).
_GO, _STOP = 1.0, 0.0


class _Stopped(Exception):
    """Rank 0 ended the generation before this step (its rows message said stop)."""


class PipelineRunner(Runner):
    """The Runner of one rank: each engine step takes its input rows from the rank before (or
    embeds, on rank 0) and passes its output rows to the rank after; the last rank's choice is
    then given to every rank. Prefill runs chunk by chunk (with a prefix cache, each rank
    snapshots its layers' state under the same keys), decoding one step at a time. A rows
    message is float32 [rows * hidden + 1]: the rows, then _GO (or _STOP with no step: rank 0
    ended the generation early, which a follower cannot see for itself)."""

    def __init__(self, engine, group: Group, hidden: int, vocab: int, prefix_cache=None, progress: bool = False,
                 mtp_depth: int = 0):
        super().__init__(engine, prefix_cache, progress)
        self.group = group
        self.mtp_depth = mtp_depth  # drafts the MTP head makes ahead in shared steps (its draft_depth; 0: no head)
        self._hidden, self._vocab = hidden, vocab
        self._chunk = engine.residual_rows().shape[0]  # rows one step takes at most
        self._last = group.size - 1
        self._logprobs = {}  # per slot: of the token shared last, when asked for (see _share_choice)
        self._shared_steps = None

    def _send_rows(self, rows: np.ndarray, flag: float, trailer: np.ndarray | None = None) -> None:
        """float32 [rows.size + 1 (+ trailer)]: the rows, the flag (and a verify step's drafts)."""
        extra = 0 if trailer is None else trailer.size
        message = np.empty(rows.size + 1 + extra, dtype=np.float32)
        message[:rows.size], message[rows.size] = rows.reshape(-1), flag
        if extra:
            message[rows.size + 1:] = trailer
        self.group.send(message, self.group.rank + 1, "sending residual rows")

    def _receive_rows(self, rows: int, extra: int = 0) -> np.ndarray:
        group = self.group
        return group.recv((rows * self._hidden + 1 + extra,), np.float32, group.rank - 1, "receiving residual rows")

    def _through(self, rows: int, step):
        """step() (one engine step over ``rows`` rows) between the rows in and the rows out;
        _Stopped (passed on, no step) when rank 0 ended the generation instead."""
        engine = self._engine
        if not engine.embeds:
            message = self._receive_rows(rows)
            if message[-1] == _STOP:
                if not engine.has_head:
                    self._send_rows(message[:-1], _STOP)
                raise _Stopped
            # A fresh view: the buffer alternates between steps.
            engine.residual_rows()[:rows] = message[:-1].reshape(rows, self._hidden)
        result = step()
        if not engine.has_head:
            self._send_rows(engine.residual_rows()[:rows], _GO)
        return result

    def _stop_here(self, rows: int = 1, extra: int = 0) -> None:
        """The generation ends before its next step (whose messages hold ``rows`` rows and ``extra``
        floats after the flag): rank 0 says so down the chain, the others take its word (a rank
        that would go on finds it in _through or _verify_through instead)."""
        group, engine = self.group, self._engine
        if group.size == 1:
            return
        size = rows * self._hidden
        if engine.embeds:
            self._send_rows(np.zeros(size, dtype=np.float32), _STOP, np.zeros(extra, dtype=np.float32))
            return
        message = self._receive_rows(rows, extra)
        if message[size] != _STOP:
            raise DistributedError(f"[distributed] rank {group.rank}: rank 0 went on generating where this rank "
                                   "stopped (the ranks' calls differ: every rank must consume the same tokens)")
        if not engine.has_head:
            self._send_rows(message[:size], _STOP, message[size + 1:])

    @property
    def shared_steps(self):
        """The engine a batching.Scheduler drives on this rank (pipeline_steps.RankSteps)."""
        if self._shared_steps is None:
            self._shared_steps = RankSteps(self)
        return self._shared_steps

    def rows_in(self, rows: int) -> np.ndarray:
        """A shared step's rows from the rank before: float32 [rows][hidden]."""
        return self._receive_rows(rows)[:-1].reshape(rows, self._hidden)

    def rows_out(self, rows: np.ndarray) -> None:
        """A shared step's output rows to the rank after."""
        self._send_rows(rows, _GO)

    def _share_choice(self, top: int = -1, slot: int = 0) -> int:
        """The token the last rank chose, now ids[position] on every rank; with ``top`` >= 0
        (Sampling.logprobs) its log-probabilities too, for ``last_logprobs``. The message:
        int32 [1] (the token), or [3 + 2 * top]: the token, then its logprobs (pipeline_steps.pack_logprobs,
        top wide)."""
        engine = self._engine
        size = 1 if top < 0 else 3 + 2 * top
        mine = np.zeros(size, dtype=np.int32) if engine.has_head else None
        if engine.has_head:
            mine[0] = engine.chosen(slot)
            if top >= 0:
                pack_logprobs(mine[1:], *engine.last_logprobs(slot))
        got = self.group.share(mine, self._last, (size,), np.int32, "sharing the chosen token")
        self._logprobs[slot] = unpack_logprobs(got[1:]) if top >= 0 else None
        token = int(got[0])
        if not engine.has_head:
            engine.set_chosen(slot, token)
        return token

    def last_logprobs(self, slot: int = 0):
        return self._logprobs.get(slot)

    def _prefill(self, ids: list[int], sampling: dict, logits: str, snapshot_at: Sequence[int] = (),
                 snapshots: list | None = None) -> list[np.ndarray]:
        return self.prefill_slot(0, ids, _core.Sampling(**sampling), snapshot_at, snapshots, logits)

    def prefill_slot(self, slot: int, ids: list[int], chosen_by, snapshot_at: Sequence[int] = (),
                     snapshots: list | None = None, logits: str = "none") -> list[np.ndarray]:
        """Feeds ``ids`` to ``slot`` from its position, a chunk per step (``chosen_by``: the
        _core.Sampling of the choice after the last); a chunk also ends at each of ``snapshot_at``
        (absolute positions, ascending), after which the state of this rank's layers goes into
        ``snapshots`` (the engine's own chunks end there too: the same steps alone)."""
        engine = self._engine
        position = engine.position(slot)
        ends = [p - position for p in snapshot_at]
        out = []
        start = 0
        while start < len(ids):
            size = min(self._chunk, len(ids) - start, *[e - start for e in ends if e > start])
            part, at = ids[start:start + size], [position + start + size] if start + size in ends else []
            asked = logits if engine.has_head else "none"
            # A chunk before the last chooses nothing; the MTP head's last row pairs with the next chunk's first id.
            then = ids[start + size] if start + size < len(ids) else None
            got = self._through(len(part), lambda: engine.prefill(slot, part, chosen_by, logits=asked,
                                                                  snapshot_at=at, snapshots=snapshots,
                                                                  next_token=then))
            if got is not None:
                out.append(got)
            start += size
        self._share_choice(chosen_by.logprobs, slot)
        return out

    def feed_prompt(self, ids: list[int], sampling: dict, boundaries: Sequence[int] = (), constraint=None,
                    images=None) -> int:
        # Images never come here: PipelineModel refuses them (NOT_YET). The last rank masks the first choice.
        reuse, snapshot_at = self.resume(ids, boundaries)
        if constraint is not None and self._engine.has_head:
            constraint.mask(self._engine.token_masks()[0])
        taken = []
        self._prefill(ids[reuse:], sampling, "none", snapshot_at, taken)
        self.keep(taken)
        return reuse

    def resume(self, ids: list[int], boundaries: Sequence[int] = (), slot: int = 0,
               images=None) -> tuple[int, list[int]]:
        # With a prefix cache the ranks then compare what they resume from (see _agree_on_cache).
        reuse, snapshot_at = super().resume(ids, boundaries, slot, images)
        if self.prefix_cache is not None:
            self._agree_on_cache(reuse)
        return reuse, snapshot_at

    def keep(self, snapshots: list, key=None) -> None:
        # Each rank counts a snapshot as the largest rank's part: the same keys kept and evicted everywhere.
        if self.prefix_cache is None or not snapshots:
            return
        sizes = self._along_chain(np.array([s.nbytes for s in snapshots], dtype=np.int64), lambda got, mine:
                                  np.maximum(got, mine), "sharing the snapshots' sizes")
        for snapshot, counted in zip(snapshots, sizes):
            self.prefix_cache.add(snapshot, None if key is None else key[:snapshot.position], counted=int(counted))

    def _agree_on_cache(self, reuse: int) -> None:
        """DistributedError on every rank unless all resume the prompt at ``reuse`` tokens and hold as
        many snapshots (the ranks' prefix caches must decide alike, or their steps would differ).
        int64 [5]: rank 0's reuse and count, the first rank that differs (-1: none), its reuse and count."""

        def compare(got, mine):
            if got[2] < 0 and not np.array_equal(got[:2], mine[:2]):
                got[2:] = self.group.rank, *mine[:2]
            return got

        mine = np.array([reuse, len(self.prefix_cache), -1, 0, 0], dtype=np.int64)
        seen = self._along_chain(mine, compare, "comparing the prefix caches")
        if seen[2] >= 0:
            raise DistributedError(f"[distributed] rank {self.group.rank}: rank {seen[2]}'s prefix cache resumes "
                                   f"the prompt at {seen[3]} tokens and holds {seen[4]} snapshots, rank 0's at "
                                   f"{seen[0]} and {seen[1]} (the ranks' calls or cache budgets differ)")

    def _along_chain(self, mine: np.ndarray, combine, what: str) -> np.ndarray:
        """combine(what the rank before passed on, mine), from rank 0 to the last rank, whose result
        every rank gets: point to point, so a wait names the rank it waits for."""
        group = self.group
        value = mine if group.rank == 0 else combine(group.recv(mine.shape, mine.dtype, group.rank - 1, what), mine)
        if group.rank < self._last:
            group.send(value, group.rank + 1, what)
        return group.share(value if group.rank == self._last else None, self._last, mine.shape, mine.dtype, what)

    def plain_tokens(self, budget: int, sampling: dict) -> Iterator[int]:
        return self._decoded_tokens(budget, sampling, None)

    def constrained_tokens(self, budget: int, sampling: dict, constraint) -> Iterator[int]:
        """plain_tokens under a grammar: before each step the last rank advances ``constraint``
        (its own; the others may pass None) with the token the step feeds and writes the next
        mask, which the step's choice reads (a host decision per token, as alone)."""
        return self._decoded_tokens(budget, sampling, constraint)

    def _decoded_tokens(self, budget: int, sampling: dict, constraint) -> Iterator[int]:
        """Decode steps across the ranks, one token each (under ``constraint`` when given)."""
        engine, chosen_by = self._engine, _core.Sampling(**sampling)
        token = engine.chosen(0)  # chosen by prefill (under the first mask with a grammar)
        for n in range(budget):
            try:
                yield token
            except GeneratorExit:  # the consumer stopped (eos, a stop string, a client gone, Ctrl-C)
                if n + 1 < budget:
                    self._stop_here()
                raise
            if n + 1 == budget:
                return
            if constraint is not None and engine.has_head:
                constraint.advance(token)
                constraint.mask(engine.token_masks()[0])
            try:
                self._through(1, lambda: self._decode_step(chosen_by))
            except _Stopped:
                return
            token = self._share_choice(sampling["logprobs"])

    def hop_seconds(self, repeats: int) -> list[float]:
        """Every rank together: the time of one decode step's rows message from rank r to r + 1
        (for each r), then of the chosen token from the last rank to rank 0; each the mean of
        ``repeats`` round trips, halved (the Macs share no clock). The same list on every rank."""
        group = self.group
        if group.size == 1:
            return []
        mine = np.full(group.size, np.nan, dtype=np.float32)
        rows = np.zeros(self._hidden + 1, dtype=np.float32)  # a decode step's message
        for first in range(group.size - 1):
            mine[first] = self._round_trips(first, first + 1, rows, repeats)
        mine[-1] = self._round_trips(self._last, 0, np.zeros(1, dtype=np.int32), repeats)
        seen = group.all_gather(mine, "sharing the hop times")
        return [float(seen[np.isfinite(seen[:, hop]), hop][0]) for hop in range(group.size)]

    def _round_trips(self, src: int, dst: int, message: np.ndarray, repeats: int) -> float:
        """Seconds per one-way trip of ``message`` between ``src`` and ``dst`` (NaN on the others)."""
        group, what = self.group, "timing a hop"
        if group.rank == src:
            start = time.perf_counter()
            for _ in range(repeats):
                group.send(message, dst, what)
                group.recv(message.shape, message.dtype, dst, what)
            return (time.perf_counter() - start) / (2 * repeats)
        if group.rank == dst:
            for _ in range(repeats):
                group.send(group.recv(message.shape, message.dtype, src, what), src, what)
        return float("nan")

    def speculative_tokens(self, ids: list[int], budget: int, sampling: dict, drafter, draft_depth: int,
                           mtp: bool | None = None) -> Iterator[int]:
        """spec.generate across the ranks: rank 0 decides each step, as spec.generate would alone,
        with drafts from ``drafter`` (rank 0's; the others pass None) or, with ``mtp`` (default:
        whether ``drafter`` is a spec.MtpHead), from the MTP head on the last rank, which drafts
        after each step for the next (its drafts come back with the step's tokens; a step without
        drafts is then a one-row verify step, which keeps the head's state). A step's message holds
        draft_depth + 1 rows (the chosen token's and the drafts', the rest unused) and, after the
        flag, the number of drafts, the drafts (padded to draft_depth) and how many drafts the head
        makes after the step, so that every rank runs the same step; the last rank verifies and
        shares (accepted drafts, next token, its drafts), the others roll back to it
        (Engine.verify_accept). Greedy output is plain decoding's."""
        engine = self._engine
        mtp = isinstance(drafter, spec.MtpHead) if mtp is None else mtp
        verify = _core.Sampling(**{k: sampling[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")})
        policy = spec.DepthPolicy(draft_depth) if engine.embeds else None
        history, left, shape = list(ids), budget, (draft_depth + 1, 2 + draft_depth)
        pending, plain = [engine.chosen(0)], 0  # tokens to yield; plain steps left in a pause (rank 0)
        head = self._first_head_drafts(draft_depth) if mtp else []  # the head's drafts for the next step
        while True:
            for token in pending:
                history.append(token)
                left -= 1
                try:
                    yield token
                except GeneratorExit:  # the consumer stopped: see _decoded_tokens
                    if left > 0:
                        self._stop_here(*shape)
                    raise
            if left <= 0:
                return
            drafts, want = None, 0
            if policy is not None:
                drafts = []
                if plain == 0:
                    k = min(policy.depth(), left - 1)
                    drafts = (drafter.draft(history, k)[:k] or head[:k]) if k > 0 else []
                    plain = 0 if drafts else min(policy.plain_tokens(), left)
                # The head drafts after this step unless the next one is plain for sure (a pause).
                want = draft_depth if mtp and plain <= 1 else 0
            start = time.perf_counter()
            try:
                pending, head = self._verify_through(drafts, verify, draft_depth, want, mtp)
            except _Stopped:
                return
            if policy is None:
                continue
            if plain:
                policy.observe_plain(1, time.perf_counter() - start)
                plain -= 1
            else:
                policy.observe_verify(len(drafts), time.perf_counter() - start)
                policy.update(len(drafts), len(pending) - 1)

    def _room(self) -> int:
        """Drafts a verify step at the engine's position may feed (the rows and the next token fit)."""
        return max(0, self._engine.max_context - self._engine.position(0) - 2)

    def _first_head_drafts(self, depth: int) -> list[int]:
        """The MTP head's drafts after the prompt, made on the last rank for rank 0 (int32 [1 +
        depth]: their number, then them); [] on the other ranks."""
        engine, group = self._engine, self.group
        message = np.zeros(1 + depth, dtype=np.int32)
        if engine.has_head:
            made = engine.mtp_drafts(0, min(depth, self._room()))
            message[0], message[1:1 + len(made)] = len(made), made
            if group.size > 1:
                group.send(message, 0, "sending the MTP head's drafts")
        elif engine.embeds:
            message = group.recv(message.shape, np.int32, self._last, "receiving the MTP head's drafts")
        return [int(t) for t in message[1:1 + message[0]]]

    def _verify_through(self, drafts: list[int] | None, sampling, depth: int, want: int,
                        mtp: bool) -> tuple[list[int], list[int]]:
        """One step of a speculative generation on this rank: ``drafts`` (rank 0's; None on the
        others, which read them from the rows message) verified, or with none a plain decode step
        (with ``mtp``: a one-row verify step); then the last rank's MTP head makes ``want`` drafts
        (rank 0's number; the others read it). Returns the accepted drafts and the next token (the
        last rank's), and the head's drafts."""
        engine, group, hidden = self._engine, self.group, self._hidden
        rows = depth + 1
        if engine.embeds:
            trailer = np.zeros(2 + depth, dtype=np.float32)
            trailer[0], trailer[1:1 + len(drafts)], trailer[-1] = len(drafts), drafts, want  # exact as float32
        else:
            message = self._receive_rows(rows, 2 + depth)
            if message[rows * hidden] == _STOP:
                if not engine.has_head:
                    self._send_rows(message[:rows * hidden], _STOP, message[rows * hidden + 1:])
                raise _Stopped
            trailer = message[rows * hidden + 1:]
            drafts, want = [int(t) for t in trailer[1:1 + int(trailer[0])]], int(trailer[-1])
            engine.residual_rows()[:len(drafts) + 1] = message[:(len(drafts) + 1) * hidden].reshape(-1, hidden)
        verifies = bool(drafts) or mtp
        if engine.has_head:
            if verifies:
                tokens = engine.verify(0, drafts, sampling)
            else:
                self._decode_step(sampling)
                tokens = [engine.chosen(0)]
            made = engine.mtp_drafts(0, min(want, self._room())) if want else []
            mine = np.zeros(3 + depth, dtype=np.int32)
            mine[:3], mine[3:3 + len(made)] = (len(tokens) - 1, tokens[-1], len(made)), made
        else:
            if verifies:
                engine.verify_rows(0, drafts)
            else:
                self._decode_step(sampling)
            out = np.zeros((rows, hidden), dtype=np.float32)
            out[:len(drafts) + 1] = engine.residual_rows()[:len(drafts) + 1]
            self._send_rows(out, _GO, trailer)
            mine = None
        got = group.share(mine, self._last, (3 + depth,), np.int32, "sharing the verified tokens")
        accepted, token = int(got[0]), int(got[1])
        if not engine.has_head:
            if verifies:
                engine.verify_accept(0, len(drafts), accepted, token)
            else:
                engine.set_chosen(0, token)
        return drafts[:accepted] + [token], [int(t) for t in got[3:3 + got[2]]]

    def _decode_step(self, sampling) -> None:
        """One decode step feeding the chosen token (the head's engine chooses the next; the
        others take it with set_chosen)."""
        engine = self._engine
        engine.decode_begin(0, 2, sampling)
        try:
            engine.decode_next()
            engine.decode_next()
        finally:
            engine.decode_end()

    def score(self, ids: list[int]) -> np.ndarray:
        self._engine.reset(0)
        parts = self._prefill(ids, {}, "all")
        mine = np.concatenate(parts) if self._engine.has_head else None
        return self.group.share(mine, self._last, (len(ids), self._vocab), np.float32, "sharing the logits")


def package_identity() -> bytes:
    """A digest of this metalqwen's Python sources (its version string among them): ranks running
    different versions or edits disagree."""
    root = os.path.dirname(os.path.abspath(__file__))
    sources = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            file = os.path.join(folder, name)
            with open(file, "rb") as f:
                sources.append((os.path.relpath(file, root), hashlib.sha256(f.read()).hexdigest()))
    return digest(sources)


def load_rank(path, *, device, max_context: int, kv_bits: int, prefill_chunk: int, prefill_layers_per_buffer: int,
              layer_split: str | None, timeout: float, speculation: Callable[[Checkpoint], tuple[str, bool, int]],
              mtp_hidden: str = "post_norm", max_sequences: int = 1) -> RankPart:
    """This rank's part of the model (see ``metalqwen.load(distributed="pipeline")``), once every
    rank has loaded. ``speculation(checkpoint)``: (mode, whether the MTP head loads, most drafts
    per step), as ``loading.load`` decides them; the last rank holds the head."""
    from . import gpu
    from .checkpoint import load_checkpoint
    from .tokenizer import Tokenizer

    group = Group(timeout)
    agree(group, "the metalqwen version (its Python sources)", package_identity())
    ckpt = load_checkpoint(path)
    agree(group, "the model (config and tensors)", model_identity(ckpt))
    tokenizer = Tokenizer.from_folder(ckpt.path)
    dev = device if isinstance(device, gpu.Device) else gpu.Device(device)
    mode, with_mtp, max_draft = speculation(ckpt)
    desc = ckpt.describe()
    layers = ckpt.config.num_hidden_layers
    memory = [int(m) for m in group.all_gather(np.array([dev.recommended_working_set], dtype=np.int64),
                                                "sharing each rank's GPU memory")[:, 0]]
    split = parse_split(layer_split, layers, group.size) if layer_split else proportional_split(layer_bytes(desc),
                                                                                                 memory)
    last = group.size - 1
    head_tensors = {**desc["tensors"], **desc["mtp"]} if with_mtp else desc["tensors"]  # the last rank's
    needs = [_core.estimate_memory(desc["dims"], head_tensors if rank == last else desc["tensors"], max_context,
                                   kv_bits, prefill_chunk, max_sequences=max_sequences, first_layer=first,
                                   end_layer=end, max_draft=max_draft, mtp=with_mtp and rank == last)
             for rank, (first, end) in enumerate(split)]
    check_fits(split, needs, memory)
    first, end = split[group.rank]
    mine = group.rank == last
    failure = None
    try:
        engine = _core.Engine(dev._native, desc["dims"], head_tensors if mine else desc["tensors"], max_context,
                              kv_bits, prefill_chunk, max_draft=max_draft, progress=None, max_sequences=max_sequences,
                              prefill_layers_per_buffer=prefill_layers_per_buffer, first_layer=first, end_layer=end,
                              mtp=with_mtp and mine, mtp_hidden=mtp_hidden)
    except Exception as e:
        failure = e
    loaded = group.all_gather(np.array([failure is None], dtype=np.uint8), "confirming every rank loaded",
                              timeout=LOAD_TIMEOUT)[:, 0]
    if failure is not None:
        raise failure
    if not loaded.all():
        failed = ", ".join(str(r) for r in range(group.size) if not loaded[r])
        raise DistributedError(f"[distributed] rank {group.rank}: rank {failed} could not load its layers "
                               "(see its error)")
    return RankPart(ckpt, tokenizer, dev, engine, group, split, mode if max_draft else "off", max_draft, with_mtp)
