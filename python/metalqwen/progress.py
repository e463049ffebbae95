"""Progress lines on stderr for the waits a user would otherwise sit through in silence:
placing the weights, the first-run kernel compile, long prefills, benchmark phases."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


# Where stderr is not a terminal (a log, CI), redraws become plain lines, at most one per this many seconds.
_PLAIN_REDRAW_SECONDS = 5.0
_last_plain_redraw = None


def _line(text: str, end: str = "", prefix: str = "metalqwen: ") -> None:
    """A progress line on stderr: redrawn in place on a terminal (end=""), else a few plain lines."""
    global _last_plain_redraw
    if sys.stderr.isatty():
        print(f"\r{prefix}{text}\033[K", end=end, file=sys.stderr, flush=True)
        return
    now = time.monotonic()
    if not end and _last_plain_redraw is not None and now - _last_plain_redraw < _PLAIN_REDRAW_SECONDS:
        return
    _last_plain_redraw = None if end else now  # a finished line lets the next bar show its start
    print(f"{prefix}{text}", file=sys.stderr, flush=True)


def _end_line() -> None:
    """Ends a line left open by redraws (only a terminal has one)."""
    if sys.stderr.isatty():
        print(file=sys.stderr, flush=True)


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {100 * done // max(total, 1):3d}%"


class _Ticker:
    """Redraws `label` with the seconds elapsed, once a second, until stopped: for a wait
    that cannot count its own progress (one compiler run). Off a terminal it stays quiet (the
    label was said once; the caller says when it is done)."""

    def __init__(self, label: str):
        self.label, self.started = label, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if sys.stderr.isatty() else None
        if self._thread:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            _line(f"{self.label}: {time.perf_counter() - self.started:.0f} s")

    def stop(self) -> float:
        self._stop.set()
        if self._thread:
            self._thread.join()
        return time.perf_counter() - self.started


class ByteBar:
    """A bar over bytes done of ``total``, redrawn at most once per percent."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self._shown = label, total, 0, None

    def set(self, done: int) -> None:
        self.done = done
        shown = 100 * done // max(self.total, 1)
        if shown != self._shown:
            self._shown = shown
            _line(f"{self.label} {_bar(done, self.total)} of {self.total / 2**30:.2f} GiB",
                  end="\n" if done >= self.total else "")

    def add(self, nbytes: int) -> None:
        self.set(self.done + nbytes)


class LoadProgress:
    """The engine's load callback: a bar while weights are placed (bytes), then what the
    kernel build costs: a ticker while a first-run compile runs (one compiler call that cannot
    count), then, on Metal, a bar over the pipelines (built concurrently) as they complete."""

    def __init__(self, device_kind: str):
        self.device_kind = device_kind
        self._weights, self._ticker, self._note = None, None, ""

    def __call__(self, stage: str, done: int, total: int, note: str) -> None:
        if stage == "weights":
            self._weights = self._weights or ByteBar(f"loading onto {self.device_kind}", total)
            self._weights.set(done)
            return
        if note and done == 0:
            self._note = note
            _line(note, end="\n")
            self._ticker = _Ticker(note)
            return
        if self._ticker:  # the first pipeline: the compile is over
            _line(f"{self._note}: done in {self._ticker.stop():.0f} s", end="\n")
            self._ticker = None
        if self.device_kind == "metal" and self._note and total:
            _line(f"building pipelines {_bar(done, total)} {done}/{total}", end="\n" if done == total else "")

    def close(self) -> None:
        """Stops a ticker left running when the load failed."""
        if self._ticker:
            self._ticker.stop()
            _end_line()
            self._ticker = None


class _InterruptNotice:
    """Says at once that a Ctrl-C was seen while the engine holds the main thread (a prefill
    chunk can run for seconds; KeyboardInterrupt is raised only between chunks). Python's C
    signal handler writes to the wakeup fd, which a thread watches. Main thread only."""

    def __init__(self, text: str):
        self.text = text
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd requires it
        self._previous = signal.set_wakeup_fd(self._write)
        self._closing = False
        self.acknowledged = threading.Event()  # set once the text is out (tests wait on it)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while data := os.read(self._read, 64):
            if self._closing:
                return
            if signal.SIGINT in data:
                _line(self.text, end="\n")
                self.acknowledged.set()

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._closing = True
        os.write(self._write, b"\0")  # wakes the watcher, which sees _closing
        self._thread.join()
        os.close(self._read)
        os.close(self._write)


class PrefillProgress:
    """Shows tokens fed / total once a prefill has run for `after` seconds; a Ctrl-C is
    acknowledged at once (the prefill stops after the chunk it is in)."""

    def __init__(self, after: float = 1.0):
        self.after, self.started, self.shown = after, time.perf_counter(), False
        in_main = threading.current_thread() is threading.main_thread()
        self._notice = _InterruptNotice("stopping after this chunk...") if in_main else None

    def __call__(self, done: int, total: int) -> None:
        if not self.shown and time.perf_counter() - self.started < self.after:
            return
        self.shown = True
        _line(f"prompt {_bar(done, total)} {done}/{total} tokens", end="\n" if done == total else "")
        if done == total:
            self.shown = False  # the line is ended

    def close(self) -> None:
        """Ends the line of a prefill that stopped early (interrupt, error)."""
        if self._notice:
            self._notice.close()
            self._notice = None
        if self.shown:
            _end_line()
            self.shown = False


def phase(label: str) -> None:
    """One line announcing a phase of a long job (benchmarks); the label names the engine."""
    _line(label, end="\n", prefix="")
