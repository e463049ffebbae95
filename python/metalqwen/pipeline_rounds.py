"""The server's continuous batching across ranks: rank 0's Scheduler (the Worker's) leads, and
before each round it sends the other ranks what changed since the last one (the requests
submitted and cancelled, in order), which they replay on a Scheduler of their own before the
same round. A Scheduler's decisions follow its requests and their tokens, which every rank
gets, so every rank then runs the same steps (pipeline_steps.RankSteps moves their rows)."""

from __future__ import annotations

from .batching import Scheduler, Sequence


class LeadingScheduler(Scheduler):
    """Rank 0's Scheduler while it leads (PipelineModel.lead): its submissions and cancellations
    go to the other ranks with the next round."""

    def __init__(self, model):
        super().__init__(model)
        self._changes: list[list] = []  # ["submit", prompt ids, max_tokens, options] | ["cancel", number]
        self._numbers: dict[int, int] = {}  # id(seq) -> its number, the order of submission
        self._submitted = 0

    def submit(self, prompt, max_tokens: int = 256, **options) -> Sequence:
        if not isinstance(prompt, list):
            raise TypeError("[distributed] a request led across ranks is token ids (the Worker's); got "
                            f"{type(prompt).__name__}")
        seq = super().submit(prompt, max_tokens, **options)  # checked here first: only good requests are sent
        self._changes.append(["submit", prompt, max_tokens, options])
        self._numbers[id(seq)] = self._submitted
        self._submitted += 1
        return seq

    def cancel(self, seq: Sequence) -> None:
        super().cancel(seq)
        number = self._numbers.pop(id(seq), None)
        if number is not None:
            self._changes.append(["cancel", number])

    def step(self) -> list[Sequence]:
        self.model.group.share_message({"call": "round", "changes": self._changes}, "sending a round to the other ranks")
        self._changes = []
        touched = super().step()
        for seq in touched:
            if seq.finished:
                self._numbers.pop(id(seq), None)
        return touched


class FollowingRounds:
    """A follower's side: rank 0's changes replayed on this rank's Scheduler, then its round."""

    def __init__(self, model):
        self._scheduler = Scheduler(model)
        self._seqs: dict[int, Sequence] = {}  # by number, until finished
        self._submitted = 0

    def round(self, message: dict) -> None:
        for change in message["changes"]:
            if change[0] == "submit":
                _, prompt, max_tokens, options = change
                self._seqs[self._submitted] = self._scheduler.submit(prompt, max_tokens, **options)
                self._submitted += 1
            elif (seq := self._seqs.pop(change[1], None)) is not None:
                self._scheduler.cancel(seq)
        for seq in self._scheduler.step():
            seq.take()
        self._seqs = {n: seq for n, seq in self._seqs.items() if not seq.finished}
