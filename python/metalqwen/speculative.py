"""Speculative decoding around ``Engine.verify``: who drafts, how deep, and the loop.

A verify step feeds the token chosen last plus k drafts as k + 1 rows of one step: the
weights stream once for all rows, so while they dominate a step's cost the extra rows are
nearly free, and every accepted draft is a token gained. The GPU accepts exactly what plain
decoding would have produced (greedy: the same tokens; sampling: the same distribution, the
drafts being point masses), so the output never depends on the drafter, only the speed does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

from . import _core

__all__ = ["Drafter", "PromptLookup", "MtpHead", "DflashBlock", "DepthPolicy", "policy_for", "DEFAULT_DEPTH",
           "DEFAULT_MTP_DEPTH", "MAX_DEPTH"]

MAX_DEPTH = _core.MAX_DRAFT  # a verify step's rows (the engine's matvec path) less the chosen token's
DEFAULT_DEPTH = 4  # each depth reserves a copy of every DeltaNet state
DEFAULT_MTP_DEPTH = 3  # MTP acceptance falls with depth (MTPLX: 0.93 / 0.86 / 0.75 at depths 1 / 2 / 3)


class Drafter(Protocol):
    """Proposes up to ``k`` tokens to follow ``history`` (the prompt and every token generated
    so far, the last one being the token the next step feeds first). Fewer, or none, is fine."""

    def draft(self, history: Sequence[int], k: int) -> list[int]: ...


class PromptLookup:
    """Prompt lookup (n-gram) drafts: the tokens that followed the most recent earlier
    occurrence of the history's last n tokens, trying n from ``max_ngram`` down to
    ``min_ngram``. No weights; it pays off on spans the output repeats (code edits,
    quoting, lists). Indexes each n-gram once, as the history grows: O(1) per step."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        self.ngrams = range(max_ngram, min_ngram - 1, -1)
        self._seen: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence that has a next token
        self._indexed = 0  # history[:_indexed] is indexed

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        length = len(history)
        for end in range(max(self._indexed, 1), length):
            # history[end] follows the n-grams ending just before it.
            for n in self.ngrams:
                if end >= n:
                    self._seen[tuple(history[end - n:end])] = end
        self._indexed = max(self._indexed, length)
        for n in self.ngrams:
            if length >= n:
                start = self._seen.get(tuple(history[length - n:]))
                if start is not None:
                    return list(history[start:start + k])
        return []


class MtpHead:
    """Drafts with the checkpoint's multi-token-prediction head, on the GPU inside the verify
    step (``Engine.verify_mtp``; in shared steps ``Engine.step``'s MTP entries): greedy chained
    drafts, so sampling stays exact with them as point masses. Where prompt lookup proposes a
    full-depth draft (a quoted span) it is used instead."""

    def __init__(self):
        self.lookup = PromptLookup()

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        """The lookup draft when it has ``k`` tokens, else none (the head drafts)."""
        drafts = self.lookup.draft(history, k)
        return drafts if len(drafts) == k else []


class DflashBlock:
    """Drafts with the DFlash drafter loaded beside the model (``load(draft=...)``), on the GPU
    inside the verify step (``Engine.verify_dflash``): one block pass gives the step's greedy
    drafts (point masses, so sampling stays exact). The host proposes nothing."""

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        return []


@dataclass
class DepthPolicy:
    """Chooses how many drafts a step verifies, from the running acceptance at each depth
    and the cost of a verify step in plain steps. Depth k is expected to give
    ``1 + sum_{i<=k} prod_{j<=i} a_j`` tokens, a_j the running acceptance of draft j given the
    ones before it were accepted: the mean of ``prior`` (worth ``prior_weight`` observations) and
    the outcomes so far, turning into an average that forgets at ``decay`` per step once it has
    enough of them, so a drafter that is never right is found out in a few steps. Costs are
    measured where ``generate`` reports timings (seconds of a verify step of k drafts over
    seconds per plain token); before that a model: ``1 + row_cost * k + wait_cost`` (rows are
    nearly free while the weights dominate; the step ends in a CPU wait that pipelined plain
    decoding avoids). With ``block`` (a drafter whose one pass drafts every depth: DFlash) a depth
    not timed yet costs the model scaled as the nearest timed depth's measurement is (a long
    context or a slow GPU makes every block length dearer at once), and one not tried yet is
    expected to be accepted as the deepest tried one is (so the block grows to what rounds
    accept). When no depth beats a plain step, speculation pauses for ``pause``
    tokens, then probes again at depth 1; each probe that fails doubles the pause (up to
    ``max_pause``), an accepted draft resets it."""

    max_depth: int
    row_cost: float = 0.04
    wait_cost: float = 0.03
    decay: float = 0.9  # weight of the past in the running acceptance
    prior: float = 0.6  # the acceptance assumed before any evidence
    prior_weight: float = 1.0  # how many observations the prior is worth
    pause: int = 16
    max_pause: int = 256
    timing_decay: float = 0.8  # weight of the past in the measured costs
    block: bool = False  # one drafter pass drafts every depth (DFlash): extrapolate costs and acceptance

    def __post_init__(self):
        self.acceptance = [self.prior] * self.max_depth
        self._tries = [0] * self.max_depth
        self._paused = 0
        self._pause = self.pause
        self._probe = False  # the next step probes (after a pause)
        self._probing = False  # the step being verified is a probe
        self._plain_seconds: float | None = None  # per plain token
        self._verify_seconds: dict[int, float] = {}  # per verify step, by drafts

    def expected_tokens(self, k: int) -> float:
        tried = [j for j in range(self.max_depth) if self._tries[j]]
        beyond = self.acceptance[tried[-1]] if self.block and tried else self.prior
        total, run = 1.0, 1.0
        for j in range(k):
            run *= self.acceptance[j] if self._tries[j] or not self.block else beyond
            total += run
        return total

    def modelled_cost(self, k: int) -> float:
        """A verify step of k drafts, in plain steps, as modelled (no timings)."""
        return 1.0 + self.row_cost * k + self.wait_cost

    def cost(self, k: int) -> float:
        """A verify step of k drafts, in plain steps: measured when both are, else modelled; with
        ``block``, scaled by the nearest timed depth's measured / modelled cost. Never below the
        model: a verify step does a plain step's work and more, so a lower measurement is noise (plain
        tokens timed while the machine was busy), and it would make a never-accepting drafter pay."""
        modelled = self.modelled_cost(k)
        if not self._plain_seconds or not self._verify_seconds or not (self.block or k in self._verify_seconds):
            return modelled
        timed = min(self._verify_seconds, key=lambda j: (abs(j - k), j))
        measured = self._verify_seconds[timed] / self._plain_seconds
        return modelled * max(1.0, measured / self.modelled_cost(timed))

    def speedup(self, k: int) -> float:
        """Tokens per plain-step cost at depth k (a plain step: 1)."""
        return self.expected_tokens(k) / self.cost(k) if k else 1.0

    def depth(self) -> int:
        """Drafts for the next step; 0 means decode plainly for ``plain_tokens()`` tokens."""
        self._probing = self._probe
        if self._probe:  # after a pause: measure again
            self._probe = False
            return min(1, self.max_depth)
        best = max(range(self.max_depth + 1), key=self.speedup)
        if best == 0 and self.max_depth:
            self._paused, self._probe = self._pause, True
        return best

    def plain_tokens(self) -> int:
        """Tokens to decode plainly now: a pause, or one when the drafter had nothing."""
        n, self._paused = max(self._paused, 1), 0
        return n

    def update(self, drafted: int, accepted: int) -> None:
        """A verify step accepted ``accepted`` of its ``drafted`` drafts: draft j was tried
        for j <= min(accepted + 1, drafted) and accepted for j <= accepted."""
        for j in range(min(accepted + 1, drafted)):
            self._tries[j] += 1
            rate = max(1.0 - self.decay, 1.0 / (self._tries[j] + self.prior_weight))
            hit = 1.0 if j < accepted else 0.0
            self.acceptance[j] += rate * (hit - self.acceptance[j])
        # A failed probe waits twice as long before the next one; any accepted draft starts over.
        if accepted:
            self._pause = self.pause
        elif self._probing:
            self._pause = min(2 * self._pause, self.max_pause)

    def observe_verify(self, drafted: int, seconds: float) -> None:
        """The wall time of a verify step of ``drafted`` drafts."""
        self._verify_seconds[drafted] = self._mix(self._verify_seconds.get(drafted), seconds)

    def observe_plain(self, tokens: int, seconds: float) -> None:
        """The wall time of ``tokens`` plainly decoded tokens (pipelined steps)."""
        if tokens > 0:
            self._plain_seconds = self._mix(self._plain_seconds, seconds / tokens)

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else self.timing_decay * old + (1.0 - self.timing_decay) * new


def policy_for(drafter: Drafter, max_depth: int) -> DepthPolicy:
    """The depth policy for a request drafted by ``drafter`` (DFlash: a block drafter)."""
    return DepthPolicy(max_depth, block=isinstance(drafter, DflashBlock))


def generate(engine, slot: int, first: int, budget: int, sampling, drafter: Drafter, policy: DepthPolicy,
             history: list[int]) -> Iterator[int]:
    """Yields up to ``budget`` tokens of the engine's ``slot`` (``sampling``: a ``_core.Sampling``):
    ``first`` (the token prefill chose), then those of
    verify steps and, while the policy pauses or the drafter has nothing, of plain decoding.
    ``history`` (prompt + tokens so far) grows as tokens are yielded. The engine calls are
    timed for the policy (the caller's time between tokens is not counted)."""
    history.append(first)
    yield first
    left = budget - 1
    mtp = isinstance(drafter, MtpHead)
    dflash = isinstance(drafter, DflashBlock)
    retry = 0  # drafts the next step makes without asking the policy (see below)
    while left > 0:
        k, retry = retry or min(policy.depth(), left - 1), 0
        drafts = drafter.draft(history, k)[:k] if k > 0 else []
        if dflash and k:
            start = time.perf_counter()
            tokens = engine.verify_dflash(slot, k, sampling)
            policy.observe_verify(k, time.perf_counter() - start)
            policy.update(k, len(tokens) - 1)
        elif mtp and not drafts and k:
            # The head drafts in the step, unless its state is missing (after plain decoding):
            # then the step drafts nothing, says nothing of acceptance, and rebuilds that state,
            # so the next step drafts at this depth.
            before = engine.counters()["drafted"]
            start = time.perf_counter()
            tokens = engine.verify_mtp(slot, k, sampling)
            made = engine.counters()["drafted"] - before
            if made:
                policy.observe_verify(made, time.perf_counter() - start)
                policy.update(made, len(tokens) - 1)
            else:
                retry = min(k, left - len(tokens) - 1)
        elif not drafts:
            # Plain decoding, pipelined; its first token is the one already yielded.
            n = min(policy.plain_tokens(), left)
            engine.decode_begin(slot, n + 1, sampling)
            try:
                engine.decode_next()
                for _ in range(n):
                    start = time.perf_counter()
                    token = engine.decode_next()
                    policy.observe_plain(1, time.perf_counter() - start)
                    history.append(token)
                    left -= 1
                    yield token
            finally:
                engine.decode_end()
            continue
        else:
            start = time.perf_counter()
            tokens = engine.verify(slot, drafts, sampling)
            policy.observe_verify(len(drafts), time.perf_counter() - start)
            policy.update(len(drafts), len(tokens) - 1)
        for token in tokens:
            history.append(token)
            left -= 1
            yield token
