"""uvicorn's server with the shutdown `metalqwen serve` wants on SIGINT/SIGTERM: the
unfinished generations end first (their streams get an error chunk), so uvicorn's wait
for open connections is short, and the process exits 0."""

from __future__ import annotations

import signal
import socket
from typing import Callable

import uvicorn


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening before the (possibly long) model load, so a busy
    port fails at once; OSError names the address."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e} (is another server using it? "
                      "--port chooses another)") from None


class GracefulServer(uvicorn.Server):
    def __init__(self, app, sock: socket.socket, on_listening: Callable[[], None], **config):
        super().__init__(uvicorn.Config(app, **config))
        self.app, self.sock, self.on_listening = app, sock, on_listening

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.on_listening()

    def handle_exit(self, sig, frame) -> None:
        self.app.state.drain()
        super().handle_exit(sig, frame)

    def serve_until_signal(self) -> None:
        # uvicorn raises the signal it caught again once it has shut down; the stop it asked
        # for is done, so here that second signal is ignored.
        previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run(sockets=[self.sock])
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
