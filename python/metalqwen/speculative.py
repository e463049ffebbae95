"""Speculative decoding around ``Engine.verify``: who drafts, how deep, and the loop.

A verify step feeds the token chosen last plus k drafts as k + 1 rows of one step: the
weights stream once for all rows, so while they dominate a step's cost the extra rows are
nearly free, and every accepted draft is a token gained. The GPU accepts exactly what plain
decoding would have produced (greedy: the same tokens; sampling: the same distribution, the
drafts being point masses), so the output never depends on the drafter, only the speed does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

__all__ = ["Drafter", "PromptLookup", "MtpHead", "DepthPolicy", "DEFAULT_DEPTH", "DEFAULT_MTP_DEPTH", "MAX_DEPTH"]

MAX_DEPTH = 7  # a verify step holds at most 8 rows (the engine's matvec path)
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
    step (``Engine.verify_mtp``): greedy chained drafts, so sampling stays exact with them as
    point masses. Where prompt lookup proposes a full-depth draft (a quoted span) it is used
    instead."""

    def __init__(self):
        self.lookup = PromptLookup()

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        """The lookup draft when it has ``k`` tokens, else none (the head drafts)."""
        drafts = self.lookup.draft(history, k)
        return drafts if len(drafts) == k else []


@dataclass
class DepthPolicy:
    """Chooses how many drafts a step verifies, from the running acceptance at each depth
    and a cost model: a verify step of k + 1 rows costs ``1 + row_cost * k + wait_cost``
    plain steps (rows are nearly free while the weights dominate; the step ends in a CPU
    wait that pipelined plain decoding avoids). Depth k is expected to give
    ``1 + sum_{i<=k} prod_{j<=i} a_j`` tokens, a_j the running acceptance of draft j given
    the ones before it were accepted. When no depth beats a plain step, speculation pauses
    for ``pause`` tokens, then probes again at depth 1."""

    max_depth: int
    row_cost: float = 0.04
    wait_cost: float = 0.03
    decay: float = 0.9  # weight of the past in the running acceptance
    prior: float = 0.6  # the acceptance assumed before any evidence
    pause: int = 16

    def __post_init__(self):
        self.acceptance = [self.prior] * self.max_depth
        self._paused = 0
        self._probe = False

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.acceptance[:k]:
            run *= a
            total += run
        return total

    def speedup(self, k: int) -> float:
        """Tokens per plain-step cost at depth k (a plain step: 1)."""
        return self.expected_tokens(k) / (1.0 + self.row_cost * k + self.wait_cost) if k else 1.0

    def depth(self) -> int:
        """Drafts for the next step; 0 means decode plainly for ``plain_tokens()`` tokens."""
        if self._probe:  # after a pause: measure again
            self._probe = False
            return min(1, self.max_depth)
        best = max(range(self.max_depth + 1), key=self.speedup)
        if best == 0 and self.max_depth:
            self._paused, self._probe = self.pause, True
        return best

    def plain_tokens(self) -> int:
        """Tokens to decode plainly now: a pause, or one when the drafter had nothing."""
        n, self._paused = max(self._paused, 1), 0
        return n

    def update(self, drafted: int, accepted: int) -> None:
        """A verify step accepted ``accepted`` of its ``drafted`` drafts: draft j was tried
        for j <= min(accepted + 1, drafted) and accepted for j <= accepted."""
        for j in range(min(accepted + 1, drafted)):
            hit = 1.0 if j < accepted else 0.0
            self.acceptance[j] = self.decay * self.acceptance[j] + (1.0 - self.decay) * hit


def generate(engine, first: int, budget: int, sampling: dict, drafter: Drafter, policy: DepthPolicy,
             history: list[int]) -> Iterator[int]:
    """Yields up to ``budget`` tokens: ``first`` (the token prefill chose), then those of
    verify steps and, while the policy pauses or the drafter has nothing, of plain decoding.
    ``history`` (prompt + tokens so far) grows as tokens are yielded."""
    history.append(first)
    yield first
    left = budget - 1
    mtp = isinstance(drafter, MtpHead)
    while left > 0:
        k = min(policy.depth(), left - 1)
        drafts = drafter.draft(history, k)[:k] if k > 0 else []
        if mtp and not drafts:
            # The head drafts (or, pausing, one-row steps that keep its state for later drafts).
            steps = [k] if k else [0] * min(policy.plain_tokens(), left)
            for depth in steps:
                tokens = engine.verify_mtp(depth, **sampling)
                if depth:
                    policy.update(depth, len(tokens) - 1)
                for token in tokens:
                    history.append(token)
                    left -= 1
                    yield token
            continue
        if not drafts:
            # Plain decoding, pipelined; its first token is the one already yielded.
            n = min(policy.plain_tokens(), left)
            engine.decode_begin(n + 1, **sampling)
            try:
                engine.decode_next()
                for _ in range(n):
                    token = engine.decode_next()
                    history.append(token)
                    left -= 1
                    yield token
            finally:
                engine.decode_end()
            continue
        tokens = engine.verify(drafts, **sampling)
        policy.update(len(drafts), len(tokens) - 1)
        for token in tokens:
            history.append(token)
            left -= 1
            yield token
