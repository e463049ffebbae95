"""`metalqwen serve` under load and at shutdown: concurrent streams, a flood of bad
requests, a queue that fills while a request runs, and SIGINT/SIGTERM mid-stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import httpx
import pytest

import metalqwen
from metalqwen.server import create_app

from ..support.server_fixtures import LiveServer, free_port, wait_until_serving


@pytest.fixture(scope="module")
def model(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, progress=False)


@pytest.fixture(scope="module")
def server(model):
    live = LiveServer(create_app(model, max_queue=8))
    yield live
    live.close()


def _chat(content: str, max_tokens: int = 8, stream: bool = False) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}


def _data_lines(lines):
    """The JSON payloads of an SSE stream's events, [DONE] as the string."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def _streamed_text(url: str, body: dict) -> str:
    text = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for event in _data_lines(r.iter_lines()):
            if event == "[DONE]":
                return "".join(text)
            assert "error" not in event, event
            delta = event["choices"][0]["delta"]
            text.append((delta.get("reasoning_content") or "") + (delta.get("content") or ""))
    raise AssertionError("the stream ended without [DONE]")


def test_eight_concurrent_streams_each_get_their_own_text(server):
    prompts = [f"question number {i}: {'why ' * i}" for i in range(8)]
    sequential = [_streamed_text(server.url, _chat(p, stream=True)) for p in prompts]
    assert len(set(sequential)) > 1, "the prompts must lead to different answers for this test to mean anything"
    together = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def client(i):
        start.wait()
        together[i] = _streamed_text(server.url, _chat(prompts[i], stream=True))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert together == sequential


def test_forty_malformed_requests_then_a_normal_one(server):
    before = httpx.post(server.url + "/v1/chat/completions", json=_chat("hello"), timeout=120).json()
    bad = [b"{", b"[]", b"null", b'{"messages": "hi"}', b'{"messages": [{"role": "user"}]}',
           b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}',
           b'{"messages": [{"role": "user", "content": "hi"}], "stream": "maybe"}', b"\xff\xfe"]
    for i in range(40):
        r = httpx.post(server.url + "/v1/chat/completions", content=bad[i % len(bad)],
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"], (bad[i % len(bad)], r.text)
    after = httpx.post(server.url + "/v1/chat/completions", json=_chat("hello"), timeout=120).json()
    assert after["choices"] == before["choices"] and after["usage"] == before["usage"]


def test_a_queue_that_fills_while_a_request_runs_answers_429(model):
    live = LiveServer(create_app(model, max_queue=1))
    try:
        url = live.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=_chat("a", max_tokens=400, stream=True), timeout=60) as running:
            events = _data_lines(running.iter_lines())
            next(events), next(events)  # the role chunk, then generated text: the engine has taken it
            with httpx.stream("POST", url, json=_chat("b", max_tokens=3, stream=True),
                              timeout=60) as waiting:
                assert waiting.status_code == 200
                assert "metalqwen_queue_depth 1" in httpx.get(live.url + "/metrics").text
                full = httpx.post(url, json=_chat("c"), timeout=60)
                assert full.status_code == 429 and full.json()["error"]["type"] == "rate_limit_error"
                running.close()  # the running client leaves: the waiting one is served in full
                assert list(_data_lines(waiting.iter_lines()))[-1] == "[DONE]"
        assert httpx.post(url, json=_chat("c"), timeout=60).status_code == 200
    finally:
        live.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_ends_streams_with_an_error_chunk_and_exits_0_on_a_signal(demo, device, sig):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "metalqwen.cli", "serve", "-m", demo, "--device", device.kind,
                             "--port", str(port), "--max-context", "512"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, 120)
        body = _chat("go on", max_tokens=480, stream=True)
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            events = _data_lines(r.iter_lines())
            next(events), next(events)  # generating
            proc.send_signal(sig)
            rest = list(events)
        assert rest and "shutting down" in rest[-1]["error"]["message"], rest[-3:]
        assert "[DONE]" not in rest and not any(e["choices"][0].get("finish_reason") for e in rest[:-1])
        assert proc.wait(timeout=60) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.stderr.close()
