"""A live `metalqwen serve` app on 127.0.0.1 for the server tests (uvicorn in a thread)."""

from __future__ import annotations

import socket
import threading
import time


class LiveServer:
    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def wait_until_serving(proc, url: str, seconds: float) -> None:
    """Waits for a `metalqwen serve` subprocess to answer /health (failing if it exits first)."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "serve did not come up"
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(url: str, api_key: str | None = None) -> dict[str, float]:
    """A server's /metrics values by name (metalqwen_ taken off)."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    lines = httpx.get(url + "/metrics", headers=headers, timeout=10).text.splitlines()
    return {name[len("metalqwen_"):]: float(value) for name, value in
            (line.split() for line in lines if line.startswith("metalqwen_"))}
