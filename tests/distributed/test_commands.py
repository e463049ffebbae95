"""`metalqwen chat|bench|serve --distributed pipeline` on 2 ranks started by mlx.launch: rank 0
reads the terminal, measures or serves, rank 1 follows its calls (prompt-lookup speculation on,
as by default); the answers are the single process's, and a rank that hangs makes the server
answer 503 and exit non-zero."""

import contextlib
import io
import json
import os
import signal
import sys
import time
import urllib.request

import pytest

import metalqwen
from metalqwen import cli

from ..support.require import require
from ..support.server_fixtures import metrics
from . import conftest, rank_script

pytestmark = pytest.mark.spread  # independent launches: any worker may take each

CHAT_INPUT = "Hello\nWhat next?\n/exit\n"


def test_chat_reads_on_rank_0_and_answers_as_one_process(tiny, launch, monkeypatch):
    alone = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO(CHAT_INPUT))
    with contextlib.redirect_stdout(alone), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(rank_script.chat_args(tiny)) == 0
    first, second = launch(tiny, "chat", stdin=CHAT_INPUT)
    assert first["code"] == second["code"] == 0, (first, second)
    assert first["stdout"] == alone.getvalue()
    assert first["stdout"].count("> ") == 3  # two turns answered, then /exit
    assert first["stderr"].count("| stopped: ") == 2  # each answer's report
    assert second["stdout"] == second["stderr"] == ""


def test_bench_reports_hops(tiny_moe_mtp, start):
    """On the MoE checkpoint, decoding with MTP drafts: the hops, and the verify steps' figures."""
    first, second = start(tiny_moe_mtp, "bench", extra=["--speculative", "mtp"]).results()
    assert first["code"] == second["code"] == 0, (first, second)
    assert second["stdout"] == second["stderr"] == ""
    assert "pipeline: 2 ranks, layers 0:2, 2:4" in first["stdout"]
    assert "hop rank 0 -> 1 (one decode step's rows, 516 bytes)" in first["stdout"]  # (hidden 128 + flag) x 4
    assert "hop rank 1 -> 0 (the chosen token, 4 bytes)" in first["stdout"]
    with open(os.path.join(first["dir"], "bench.json")) as f:
        data = json.load(f)
    pipe = data["pipeline"]
    assert [(h["src"], h["dst"]) for h in pipe["hops"]] == [(0, 1), (1, 0)]
    assert all(h["seconds"] > 0 for h in pipe["hops"])
    assert pipe["hop_seconds_per_step"] == pytest.approx(sum(h["seconds"] for h in pipe["hops"]))
    decode = data["metalqwen"]["decode"]
    assert [s["context"] for s in pipe["share_of_step"]] == [d["context"] for d in decode]
    for share, d in zip(pipe["share_of_step"], decode):
        assert d["tokens_per_second"] > 0
        assert share["share"] == pytest.approx(pipe["hop_seconds_per_step"] * d["tokens_per_second"])
    spec = data["metalqwen"]["speculative"]
    assert spec["verify_steps"] > 0 and 0 < spec["accepted"] <= spec["drafted"], spec
    assert "speculative: " in first["stdout"]


def wait_for_server(port: int, launch: conftest.Launch, seconds: float = 100) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if launch.proc.poll() is not None:
            pytest.fail(f"the ranks exited before serving: {launch.results()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        time.sleep(0.5)
    pytest.fail(f"no server on port {port} after {seconds} s")


@pytest.fixture(scope="module")
def reference(tiny):
    """The single process's server (in-process) for the same requests."""
    from fastapi.testclient import TestClient

    from metalqwen.server import create_app

    model = metalqwen.load(tiny, **rank_script.OPTIONS)
    return TestClient(create_app(model, model_id="tiny"))


CHAT = dict(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0)
PROMPT_IDS = [5, 17, 300, 42, 8]


def stopping_early(reference) -> dict:
    """A completion request that a stop string ends before max_tokens (so rank 0 alone stops it)."""
    full = reference.post("/v1/completions", json=dict(model="tiny", prompt=PROMPT_IDS, max_tokens=8,
                                                      temperature=0)).json()["choices"][0]["text"]
    stop = next((full[i:i + 1] for i in range(2, len(full)) if full[i] not in full[:i] and full[i].strip()), None)
    if stop is None:
        pytest.fail(f"no character of the reference answer {full!r} to stop at")
    return dict(model="tiny", prompt=PROMPT_IDS, max_tokens=8, temperature=0, stop=[stop])


def test_serve_answers_the_openai_client_as_one_process(tiny, start, reference):
    require("openai")
    import openai

    port = conftest.free_ports(1)
    launch = start(tiny, "serve", extra=[str(port)])
    wait_for_server(port, launch)
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    asked = {**CHAT, "logprobs": True, "top_logprobs": 2}
    want = reference.post("/v1/chat/completions", json=asked).json()
    got = client.chat.completions.create(**asked)
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"]
    assert got.choices[0].logprobs.model_dump()["content"] == want["choices"][0]["logprobs"]["content"]

    early = stopping_early(reference)
    want = reference.post("/v1/completions", json=early).json()
    assert want["choices"][0]["finish_reason"] == "stop" and want["usage"]["completion_tokens"] < 8
    got = client.completions.create(**early)
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"]

    # After rank 0 alone stopped a generation, the ranks still step together: a stream, as one process.
    want = reference.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}).json()
    assert streamed_text(client.chat.completions.create(**{**CHAT, "max_tokens": 5}, stream=True)) == answer_text(want)
    # That stream resumed from the first request's snapshot across the ranks (the reference has no cache).
    assert metrics(url)["cache_hits_total"] == 1
    # Structured output: the last rank masks each choice, as one process does (no thinking: the answer is JSON).
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": rank_script.SCHEMA}}
    asked, no_thinking = {**CHAT, "max_tokens": 8, "response_format": schema}, {"enable_thinking": False}
    want = reference.post("/v1/chat/completions", json={**asked, "chat_template_kwargs": no_thinking}).json()
    assert want["choices"][0]["message"]["content"].startswith("{"), want  # JSON (whitespace allowed)
    got = client.chat.completions.create(**asked, extra_body={"chat_template_kwargs": no_thinking})
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    # Two requests at once share the steps across the ranks (--max-sequences 4 by default). The second
    # is sent once the first has streamed a token, so it joins while the first has up to 31 to go:
    # fewer steps than tokens, and each gets its single request's answer.
    asks = [{**CHAT, "max_tokens": 32}, {**CHAT, "messages": [{"role": "user", "content": "What next?"}]}]
    answers = [reference.post("/v1/chat/completions", json=ask).json() for ask in asks]
    before = metrics(url)
    stream = client.chat.completions.create(**asks[0], stream=True)
    begun = []
    while streamed_text(begun) == ("", ""):
        begun.append(next(stream))
    second = client.chat.completions.create(**asks[1])
    assert streamed_text(begun + list(stream)) == answer_text(answers[0])
    assert answer_text(second.model_dump()) == answer_text(answers[1])
    after = metrics(url)
    generated = after["generated_tokens_total"] - before["generated_tokens_total"]
    assert generated == sum(answer["usage"]["completion_tokens"] for answer in answers) == 32 + 6
    assert after["engine_steps_total"] - before["engine_steps_total"] < generated - 3
    os.kill(int((launch.out / "rank0.pid").read_text()), signal.SIGTERM)
    first, second = launch.results()
    assert first["code"] == second["code"] == 0, (first, second)
    assert "4 sequence slot(s)" in first["stderr"] and "one at a time" not in first["stderr"]
    assert second["stdout"] == second["stderr"] == ""


def streamed_text(chunks) -> tuple[str, str]:
    """(content, reasoning) of a chat completion's streamed chunks (openai client objects)."""
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    return ("".join(d.content or "" for d in deltas),
            "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas))


def answer_text(answer: dict) -> tuple[str, str]:
    """(content, reasoning) of a chat completion's JSON."""
    message = answer["choices"][0]["message"]
    return message["content"] or "", message.get("reasoning_content") or ""


def test_serve_answers_503_and_exits_when_a_rank_hangs(tiny, start):
    require("openai")
    import openai

    port = conftest.free_ports(1)
    launch = start(tiny, "serve-hang", extra=[str(port)])
    wait_for_server(port, launch)
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    client.chat.completions.create(**CHAT)  # rank 1 follows the first request
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(**CHAT)
    assert refused.value.status_code == 503
    assert f"no answer from rank 1 within {rank_script.TIMEOUT:g} s" in refused.value.message
    assert time.monotonic() - started < rank_script.TIMEOUT + 10
    first, second = launch.results(timeout=60)
    assert first["code"] == 1, first
    assert "metalqwen: [distributed] rank 0: " in first["stderr"]
    assert second["code"] == 1 and "stopped by SIGTERM" in second["stderr"], second
