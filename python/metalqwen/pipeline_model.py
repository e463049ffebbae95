"""``load(..., distributed="pipeline")``'s Model: every rank runs the same calls over its layers
(``pipeline.PipelineRunner`` moves the rows), in lockstep or following rank 0 (the CLI, the server)."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import arguments, pipeline, speculative as spec
from .errors import EngineError
from .generation import Chunk, Generation, Prompt, Request
from .batching import Scheduler
from .model import Model
from .pipeline_rounds import FollowingRounds, LeadingScheduler
from .prefix_cache import PrefixCache

__all__ = ["PipelineModel"]


class PipelineModel(Model):
    """A Model whose layers are spread over the ranks ``mlx.launch`` started (``load(...,
    distributed="pipeline")``; ``split``: each rank's layers). Either every rank makes the same
    calls in the same order and gets the same results (each call's arguments are compared across
    ranks first), or rank 0 leads (``lead``: it sends each call to the others, which ``follow``
    it until its ``release``): how the CLI and the server run. What does not run across ranks
    yet is refused (``pipeline.NOT_YET``)."""

    def __init__(self, loaded: pipeline.RankPart, progress: bool, prefix_cache: PrefixCache | None = None):
        super().__init__(loaded.checkpoint, loaded.tokenizer, loaded.device, loaded.engine, progress,
                         speculative=loaded.speculative, draft_depth=loaded.draft_depth,
                         no_vision=f"not yet with distributed='pipeline' (not yet: {pipeline.NOT_YET})")
        self.group, self.split = loaded.group, loaded.split
        c = loaded.checkpoint.config
        self.runner = pipeline.PipelineRunner(loaded.engine, self.group, c.hidden_size, c.vocab_size, prefix_cache,
                                              progress, mtp_depth=loaded.draft_depth if loaded.mtp else 0)
        self._leading = False
        self._with_mtp = loaded.mtp

    @property
    def _mtp_loaded(self) -> bool:
        return self._with_mtp

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def layers(self) -> tuple[int, int]:
        """This rank's layers [first, end)."""
        return self.split[self.rank]

    def _refuse(self, what: str):
        raise EngineError(f"[distributed] {what} is not yet supported with distributed='pipeline' (not yet: "
                          f"{pipeline.NOT_YET})")

    def _call(self, what: str, **arguments) -> None:
        """Before a call: rank 0, leading, sends it to the followers; else every rank checks that
        the others make the same call."""
        if self._leading:
            self.group.share_message({"call": what, **arguments}, f"sending {what} to the other ranks")
        else:
            pipeline.agree(self.group, f"the arguments of {what}", pipeline.digest(what, arguments))

    def lead(self) -> None:
        """Rank 0: from now on each call (stream, generate, score, reset, hop_seconds) is sent to
        the other ranks, which run it in ``follow``, until ``release``."""
        if self.rank != 0:
            raise ValueError(f"[distributed] rank {self.rank}: only rank 0 leads (the others follow)")
        self._leading = True

    def release(self) -> None:
        """Rank 0, done leading: the followers return from ``follow``; each confirms (one that is
        gone raises DistributedError)."""
        self._leading = False
        self.group.share_message({"call": "done"}, "releasing the other ranks")
        self.group.all_gather(np.ones(1, dtype=np.uint8), "confirming the other ranks are done")

    def lead_with(self, work: Callable[[], Any]) -> Any:
        """What the CLI runs on every rank: on rank 0, ``work()`` (reading the terminal, serving,
        measuring) with the other ranks following its calls, released at its end (unless the group
        broke); on the others, ``follow`` (returns None)."""
        if self.rank != 0:
            self.follow()
            return None
        self.lead()
        try:
            return work()
        finally:
            if not self.group.broken:
                self.release()

    def follow(self) -> None:
        """Ranks > 0: run rank 0's calls as they come (waiting for each as long as rank 0 is
        connected) until its ``release``. Ctrl-C is left to rank 0 (it reaches every local rank)."""
        if self.rank == 0:
            raise ValueError("[distributed] rank 0 leads: follow() is for the other ranks")
        handlers = {"stream": self._follow_stream, "score": lambda m: self.runner.score(m["ids"]),
                    "reset": lambda m: self._engine.reset(0),
                    "generate_batch": lambda m: self._batch(m["prompts"], m["max_tokens"], m["options"]),
                    "round": lambda m: rounds.round(m),
                    "hop_seconds": lambda m: self.runner.hop_seconds(m["repeats"])}
        rounds = FollowingRounds(self)  # the server's rounds (LeadingScheduler), if rank 0 serves several at once
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            while True:
                message = self.group.share_message(None, "waiting for rank 0's next call", forever=True)
                if message["call"] == "done":
                    break
                handlers[message["call"]](message)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        self.group.all_gather(np.ones(1, dtype=np.uint8), "confirming this rank is done")

    def _follow_stream(self, message: dict) -> None:
        """Rank 0's generation, step for step: its prompt, then decode steps until its budget or its stop."""
        sampling = {**message["sampling"], "logit_bias": [tuple(p) for p in message["sampling"]["logit_bias"]]}
        # Under a grammar the last rank masks each choice: it alone rebuilds rank 0's constraint.
        grammar = message["grammar"] if self._engine.has_head else None
        constraint = self.grammars.again(grammar) if grammar is not None else None
        self.runner.feed_prompt(message["ids"], sampling, message["boundaries"], constraint)
        if message["grammar"] is not None:
            tokens = self.runner.constrained_tokens(message["budget"], sampling, constraint)
        elif message["speculative"]:  # rank 0 (or the MTP head) drafts: the drafts come with each step's rows
            tokens = self.runner.speculative_tokens(message["ids"], message["budget"], sampling, None,
                                                    self.draft_depth, mtp=message["speculative"] == "mtp")
        else:
            tokens = self.runner.plain_tokens(message["budget"], sampling)
        for _ in tokens:
            pass

    def scheduler(self) -> Scheduler:
        """Rank 0 leading (the server): a Scheduler whose rounds the other ranks follow."""
        return LeadingScheduler(self) if self._leading else Scheduler(self)

    def reset(self) -> None:
        if self._leading:
            self._call("reset")
        super().reset()

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = arguments.token_ids("token_ids", token_ids, self.config.vocab_size)
        self._check_fits(ids)
        self._call("score", ids=ids)
        return self.runner.score(ids)

    def hop_seconds(self, repeats: int = 20) -> list[float]:
        """Seconds for one decode step's rows to go from rank r to r + 1 (for each r), then for the
        chosen token to go from the last rank to rank 0 (round trips halved; see bench)."""
        self._call("hop_seconds", repeats=repeats)
        return self.runner.hop_seconds(repeats)

    def _run(self, request: Request) -> Iterator[Chunk]:
        if self._leading:  # the followers take rank 0's sampling, seed included
            budget = min(request.max_tokens, self.max_context - len(request.ids))
            self._call("stream", ids=request.ids, budget=budget, sampling=request.sampling,
                       boundaries=[int(b) for b in request.boundaries], speculative=_drafting(request),
                       grammar=_grammar(request))
        else:  # only the last rank samples: a seed left to chance may differ
            sampling = {k: v for k, v in request.sampling.items() if k != "seed"}
            self._call("generate/stream", ids=request.ids, max_tokens=request.max_tokens, sampling=sampling,
                       stop=request.stop, boundaries=[int(b) for b in request.boundaries],
                       speculative=_drafting(request), grammar=_grammar(request))
        yield from super()._run(request)

    def generate_batch(self, prompts: Sequence[Prompt], max_tokens: int = 256, **options) -> list[Generation]:
        """Model.generate_batch across the ranks: every rank runs the same Scheduler (its decisions
        follow the tokens, which every rank gets), each shared step's rows going along the ranks
        (pipeline_steps.RankSteps; the MTP head's drafts come from the last rank)."""
        if self.group.size > 1 and self.max_sequences < 2:
            raise EngineError("[distributed] generate_batch across ranks needs load(max_sequences=2 or more) "
                              "(with one slot, call generate for each prompt)")
        drafter = options.get("speculative")
        if not isinstance(drafter, (str, type(None))):  # each rank's own Drafter drafts (it must draft alike)
            if self._leading:
                raise EngineError("[distributed] generate_batch led by rank 0 takes speculative='mtp', 'lookup' or "
                                  "'off' (a Drafter object cannot be sent to the other ranks)")
            drafter = type(drafter).__name__
        self._call("generate_batch", prompts=list(prompts), max_tokens=max_tokens,
                   options={**options, "speculative": drafter} if "speculative" in options else options)
        return self._batch(prompts, max_tokens, options)

    def _batch(self, prompts, max_tokens: int, options: dict) -> list[Generation]:
        scheduler = Scheduler(self)  # on every rank (led: rank 0 sent the call)
        requests = [scheduler.submit(p, max_tokens, **options) for p in prompts]
        scheduler.run()
        return [r.generation() for r in requests]

    def mtp_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        self._refuse("mtp_logits")


def _drafting(request: Request) -> str | None:
    """Who drafts a request's steps across the ranks: "mtp" (the head, on the last rank), "host"
    (rank 0's drafter) or None (plain decoding)."""
    if request.drafter is None:
        return None
    return "mtp" if isinstance(request.drafter, spec.MtpHead) else "host"


def _grammar(request: Request) -> str | None:
    """The request's grammar (llguidance's text; None: unconstrained)."""
    return request.constraint.grammar if request.constraint is not None else None
