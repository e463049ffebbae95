"""One engine, one thread: requests queue here (FIFO, bounded) and run on it.

The engine is not thread-safe, and a decode step is bound by streaming the weights. With one
sequence slot (``load(max_sequences=1)``) requests take turns; with more, up to that many run
together in shared steps (``batching.Scheduler``: continuous batching, joining and leaving
between steps), the rest wait here; jobs with images batch as the others do (the vision tower
runs when the job joins, on this thread). Each job streams
its chunks back to the asyncio loop that waits for them; a cancelled job (client gone) stops
before its next step and frees its slot.
A step the GPU fails ends the jobs it ran for with the GpuError (the engine reset their
sequences); the next jobs run as usual. On shutdown every job not yet finished ends with
ShuttingDown, so its stream closes with an error chunk. A pipeline rank that fails
(DistributedError) ends every unfinished job with that error and stops the server.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from ..batching import Sequence
from ..errors import DistributedError
from ..model import Model

_DONE = object()


class QueueFull(Exception):
    """More requests waiting than the server takes (HTTP 429)."""


class ShuttingDown(Exception):
    """The server was asked to stop (SIGINT/SIGTERM) before this job finished (HTTP 503)."""


@dataclass
class Job:
    prompt: list[int]
    options: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    error: BaseException | None = None
    stats: Any = None
    finish_reason: str = "stop"
    first_token_at: float | None = None  # time.monotonic() when its first chunk reached the response
    images: list = field(default_factory=list)  # the pictures of the prompt's image places, in order

    def _put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    async def chunks(self):
        """The generated model.Chunks (text and, when asked, logprobs); raises what the generation raised."""
        while (item := await self.events.get()) is not _DONE:
            yield item
        if self.error is not None:
            raise self.error


class _Stop(Exception):
    """The engine thread's queue got the stop mark."""


class Worker:
    def __init__(self, model: Model, max_queue: int, on_done=None, on_fatal=None):
        """``on_done(job)`` is called on the engine thread as each job ends: finished, failed,
        cancelled or disconnected (its stats hold what it generated); ``on_fatal(error)`` once a
        pipeline rank failed (DistributedError: every unfinished job ended with it, new ones refused)."""
        self.model, self.max_queue, self.on_done, self.on_fatal = model, max_queue, on_done, on_fatal
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._unfinished: dict[int, Job] = {}  # the jobs submitted and not done, by id()
        self._closing = False
        self._lock = threading.RLock()  # drain() may run in a signal handler that interrupted submit()
        batched = model.max_sequences > 1
        self._scheduler = model.scheduler() if batched else None
        self._thread = threading.Thread(target=self._run_batched if batched else self._run, name="metalqwen-engine",
                                        daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> Job:
        with self._lock:
            if self._closing:
                raise ShuttingDown("the server is shutting down")
            if self._waiting >= self.max_queue:
                raise QueueFull(f"{self._waiting} requests are waiting (--max-queue {self.max_queue}); retry later")
            self._waiting += 1
            self._unfinished[id(job)] = job
        self._jobs.put(job)
        return job

    def drain(self, error: Exception | None = None) -> None:
        """Ends every unfinished job with ``error`` (default ShuttingDown) and refuses new ones (thread-safe)."""
        with self._lock:
            self._closing = True
            for job in self._unfinished.values():
                job.error, job.cancelled = job.error or error or ShuttingDown("the server is shutting down"), True

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
            if not job.cancelled:
                self._generate(job)
            self._done(job)

    def _take(self, block: bool) -> Job | None:
        """The next job from the queue (None when stopping or, not blocking, when none waits)."""
        try:
            job = self._jobs.get(block=block)
        except queue.Empty:
            return None
        if job is None:
            raise _Stop
        with self._lock:
            self._waiting -= 1
        return job

    def _done(self, job: Job) -> None:
        with self._lock:  # a drain from here on no longer touches this finished job
            del self._unfinished[id(job)]
        if self.on_done:
            self.on_done(job)
        job._put(_DONE)

    def _run_batched(self) -> None:
        """Continuous batching: jobs join the scheduler while it has room, every step advances them all."""
        scheduler = self._scheduler
        active: dict[int, tuple[Job, Sequence]] = {}  # by id(job)
        try:
            while True:
                # Wait for work when idle; otherwise take what waits, up to the free slots.
                while len(active) < self.model.max_sequences:
                    job = self._take(block=not active)
                    if job is None:
                        break
                    if job.cancelled:
                        self._done(job)
                        continue
                    try:
                        active[id(job)] = job, scheduler.submit(job.prompt, images=job.images, **job.options)
                    except Exception as e:  # a bad request: refused, the others go on
                        job.error = e
                        self._done(job)
                for job, seq in list(active.values()):
                    if job.cancelled:
                        scheduler.cancel(seq)
                try:
                    scheduler.step()
                except DistributedError as e:  # a rank is gone: no request can run any more
                    self._fail(e, active)
                    active.clear()
                except Exception as e:  # handed to every request of the failed step
                    for job, seq in active.values():
                        job.error = e
                        scheduler.cancel(seq)
                for key, (job, seq) in list(active.items()):
                    for chunk in seq.take():
                        job._put(chunk)
                    if seq.finished:
                        job.stats, job.finish_reason = seq.output.stats, seq.output.finish_reason
                        job.error = job.error or seq.error
                        del active[key]
                        self._done(job)
        except _Stop:
            for job, seq in active.values():
                scheduler.cancel(seq)
                job.error = job.error or ShuttingDown("the server is shutting down")
                self._done(job)

    def _fail(self, error: DistributedError, active: dict) -> None:
        """A pipeline rank failed in a shared step: its jobs end with the error, the server stops."""
        for job, _ in active.values():
            job.error = error
            self._done(job)
        self.drain(error)
        if self.on_fatal:
            self.on_fatal(error)

    def _generate(self, job: Job) -> None:
        try:
            stream = self.model.stream(job.prompt, images=job.images, **job.options)
            try:
                for chunk in stream:
                    if job.cancelled:
                        break
                    job._put(chunk)
            finally:
                stream.close()
            job.stats, job.finish_reason = self.model.last_stats, self.model.last_finish_reason
        except DistributedError as e:  # a rank is gone: no request can run any more
            job.error = e
            self.drain(e)
            if self.on_fatal:
                self.on_fatal(e)
        except Exception as e:  # handed to the request that asked (the engine stays usable)
            job.error = e
