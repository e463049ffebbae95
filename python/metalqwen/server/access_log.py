"""One line per request on the `metalqwen.server` logger (stderr under `metalqwen serve`): method,
path, status, and for generations the prompt / cached / generated tokens, time to first token and
decode speed. A streamed response is logged when its last byte is sent."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("metalqwen.server")


def request_line(method: str, path: str, status: int, started: float, job=None) -> str:
    """The log line of one request; ``job`` (worker.Job) when it generated."""
    seconds = time.monotonic() - started
    line = f"{method} {path} {status} {seconds * 1000:.0f} ms"
    s = job.stats if job is not None else None
    if s is None:
        return line
    ttft = f"{(job.first_token_at - started) * 1000:.0f} ms" if job.first_token_at else "-"
    return (f"{line} | prompt {s.prompt_tokens} (cached {s.prompt_tokens_reused}), generated "
            f"{s.generated_tokens}, first token {ttft}, {s.decode_tokens_per_second:.1f} tok/s")


async def logged_body(body, method: str, path: str, status: int, started: float, request_state):
    """``body`` (a response's byte iterator) passed through, then the request's line logged."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        log.info(request_line(method, path, status, started, getattr(request_state, "job", None)))


def configure(level: str) -> None:
    """`metalqwen serve --log-level`: the request lines (info) and errors on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("metalqwen: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
