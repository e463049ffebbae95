"""The group of ranks a distributed model runs on: MLX's distributed layer (``mlx.launch``
starts the ranks, ``mx.distributed.init`` gives the group; ring over TCP or Thunderbolt IP,
JACCL over Thunderbolt RDMA), moving numpy arrays as their exact bytes. Every wait on another
rank is bounded: one that died, hangs or cannot be reached makes the call raise
DistributedError naming it, never hang."""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from typing import Callable

import numpy as np

from .errors import DistributedError

DEFAULT_TIMEOUT = 60.0  # seconds any one transfer may wait for another rank
LOAD_TIMEOUT = 1800.0  # seconds the ranks wait for each other to load (hundreds of GB, a first kernel compile)


class _Worker:
    """A daemon thread running the transfers, so the caller's wait has a timeout: MLX's
    send/recv block in C++ and cannot be interrupted. After a timeout the thread may stay
    blocked; the group is then broken and refuses every later transfer."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, name="metalqwen-distributed", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job, done, box = self._jobs.get()
            try:
                box.append((True, job()))
            except BaseException as e:  # handed to the waiting caller
                box.append((False, e))
            done.set()

    def run(self, job: Callable, timeout: float):
        """job()'s result; TimeoutError after ``timeout`` seconds; job's exception re-raised."""
        done, box = threading.Event(), []
        self._jobs.put((job, done, box))
        if not done.wait(timeout):  # interruptible: a SIGTERM handler's exception comes through here
            raise TimeoutError
        ok, value = box[0]
        if not ok:
            raise value
        return value


class Group:
    """This process's rank in the group ``mlx.launch`` started (a group of 1 when run alone).
    ``timeout``: seconds any transfer may wait for its peer. ``wait_seconds`` adds up the time
    spent in transfers (the hops, and waiting for the ranks before)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        try:
            import mlx.core as mx
        except ImportError as e:
            raise DistributedError("[distributed] needs MLX: pip install mlx (on a Mac) or mlx[cpu] (Linux), "
                                   "then start the ranks with mlx.launch") from e
        if not timeout > 0:
            raise ValueError(f"distributed timeout must be positive seconds, got {timeout!r}")
        self._mx = mx
        self._group = mx.distributed.init()
        self.rank, self.size = self._group.rank(), self._group.size()
        self.timeout = float(timeout)
        self.wait_seconds = 0.0
        self._worker = _Worker()
        self._broken: str | None = None
        self._stop_on_sigterm()

    def _stop_on_sigterm(self) -> None:
        """mlx.launch SIGTERMs the other ranks when one exits with an error: raise DistributedError
        (in the main thread) instead of dying without a word."""
        if threading.current_thread() is not threading.main_thread():
            return
        rank = self.rank

        def stop(signum, frame):
            raise DistributedError(f"[distributed] rank {rank}: stopped by SIGTERM (mlx.launch sends it when "
                                   "another rank exits with an error: see that rank's message)")

        signal.signal(signal.SIGTERM, stop)

    @property
    def broken(self) -> bool:
        """Whether a transfer failed (every later one is refused)."""
        return self._broken is not None

    def _transfer(self, job: Callable, what: str, peer: str, timeout: float | None = None, forever: bool = False):
        if self._broken:
            raise DistributedError(self._broken)
        timeout = max(self.timeout, timeout or 0.0)
        start = time.perf_counter()
        try:
            return self._worker.run(job, None if forever else timeout)
        except TimeoutError:
            self._broken = (f"[distributed] rank {self.rank}: {what}: no answer from {peer} within {timeout:g} s "
                            "(it exited, hangs or cannot be reached; a larger distributed_timeout allows slower "
                            "steps)")
            raise DistributedError(self._broken) from None
        except DistributedError:
            raise
        except Exception as e:
            self._broken = f"[distributed] rank {self.rank}: {what} with {peer} failed: {e}"
            raise DistributedError(self._broken) from e
        finally:
            self.wait_seconds += time.perf_counter() - start

    def send(self, array: np.ndarray, dst: int, what: str) -> None:
        """Sends ``array``'s bytes to rank ``dst`` (which calls recv with its shape and dtype)."""
        mx, data = self._mx, np.ascontiguousarray(array)
        self._transfer(lambda: mx.eval(mx.distributed.send(mx.array(data), dst, group=self._group, stream=mx.cpu)),
                       what, f"rank {dst}")

    def recv(self, shape: tuple, dtype, src: int, what: str, forever: bool = False) -> np.ndarray:
        """The array rank ``src`` sends, exactly; ``forever``: no time bound (a follower idle until
        rank 0's next request: a lost connection or mlx.launch's SIGTERM still ends the wait)."""
        mx, kind = self._mx, _mx_dtype(self._mx, dtype)

        def job():
            got = mx.distributed.recv(tuple(shape), kind, src, group=self._group, stream=mx.cpu)
            mx.eval(got)
            return np.array(got, copy=True)

        return self._transfer(job, what, f"rank {src}", forever=forever)

    def all_gather(self, array: np.ndarray, what: str, timeout: float | None = None) -> np.ndarray:
        """[size, *array.shape]: every rank's ``array`` (each rank gives the same shape and dtype);
        ``timeout`` lengthens the wait (loads)."""
        mx, data = self._mx, np.ascontiguousarray(array)[None]

        def job():
            got = mx.distributed.all_gather(mx.array(data), group=self._group, stream=mx.cpu)
            mx.eval(got)
            return np.array(got, copy=True)

        return self._transfer(job, what, "the other ranks", timeout)

    def share(self, array: np.ndarray | None, src: int, shape: tuple, dtype, what: str) -> np.ndarray:
        """Rank ``src``'s ``array`` on every rank (the others pass None and its shape and dtype)."""
        if self.rank == src:
            for dst in range(self.size):
                if dst != src:
                    self.send(array, dst, what)
            return array
        return self.recv(shape, dtype, src, what)

    def share_message(self, message: dict | None, what: str, forever: bool = False) -> dict:
        """Rank 0's ``message`` (JSON) on every rank (the others pass None; ``forever``: they wait
        without a bound for it, see ``recv``)."""
        if self.rank == 0:
            data = np.frombuffer(json.dumps(message).encode(), dtype=np.uint8)
            self.share(np.array([data.size], dtype=np.int64), 0, (1,), np.int64, what)
            self.share(data, 0, data.shape, np.uint8, what)
            return message
        size = self.recv((1,), np.int64, 0, what, forever=forever)
        return json.loads(self.recv((int(size[0]),), np.uint8, 0, what).tobytes())


def _mx_dtype(mx, dtype):
    kinds = {np.dtype(np.float32): mx.float32, np.dtype(np.int32): mx.int32, np.dtype(np.uint8): mx.uint8,
             np.dtype(np.int64): mx.int64, np.dtype(np.uint32): mx.uint32}
    return kinds[np.dtype(dtype)]
