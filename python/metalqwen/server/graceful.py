"""uvicorn's server with the shutdown `metalqwen serve` wants on SIGINT/SIGTERM: the
unfinished generations end first (their streams get an error chunk), so uvicorn's wait
for open connections is short, and the process exits 0."""

from __future__ import annotations

import signal

import uvicorn


class GracefulServer(uvicorn.Server):
    def __init__(self, app, **config):
        super().__init__(uvicorn.Config(app, **config))
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        self.app.state.drain()
        super().handle_exit(sig, frame)

    def serve_until_signal(self) -> None:
        # uvicorn raises the signal it caught again once it has shut down; the stop it asked
        # for is done, so here that second signal is ignored.
        previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
