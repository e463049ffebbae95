"""One line per request on the `metalqwen.server` logger (stderr under `metalqwen serve`): method,
path, status, and for generations the prompt / cached / generated tokens, time to first token and
decode speed. A streamed response is logged when its last byte is sent."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("metalqwen.server")


def request_line(method: str, path: str, status: int, started: float, jobs=()) -> str:
    """The log line of one request; ``jobs`` (worker.Job, one per choice) when it generated."""
    seconds = time.monotonic() - started
    line = f"{method} {path} {status} {seconds * 1000:.0f} ms"
    stats = [job.stats for job in jobs if job.stats is not None]
    if not stats:
        return line
    first = min((job.first_token_at for job in jobs if job.first_token_at), default=None)
    ttft = f"{(first - started) * 1000:.0f} ms" if first else "-"
    choices = f" in {len(jobs)} choices" if len(jobs) > 1 else ""
    return (f"{line} | prompt {stats[0].prompt_tokens} (cached {stats[0].prompt_tokens_reused}), generated "
            f"{sum(s.generated_tokens for s in stats)}{choices}, first token {ttft}, "
            f"{sum(s.decode_tokens_per_second for s in stats):.1f} tok/s")


async def logged_body(body, method: str, path: str, status: int, started: float, request_state):
    """``body`` (a response's byte iterator) passed through, then the request's line logged."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        log.info(request_line(method, path, status, started, getattr(request_state, "jobs", ())))


def configure(level: str) -> None:
    """`metalqwen serve --log-level`: the request lines (info) and errors on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("metalqwen: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
