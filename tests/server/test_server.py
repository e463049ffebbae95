"""`metalqwen serve` on 127.0.0.1 with the demo checkpoint, spoken to by the official
`openai` client and by raw HTTP for what a client library would not send."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

import metalqwen
from metalqwen.server import create_app

from ..support.require import require
from ..support.server_fixtures import LiveServer, free_port


@pytest.fixture(scope="module")
def model(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, progress=False)


def _greedy(model, ids, n):
    model.reset()
    return model.generate(ids, max_tokens=n)


def test_models_and_health(server, client, demo):
    import os

    assert [m.id for m in client.models.list().data] == [os.path.basename(demo)]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_chat_completion_equals_the_model_and_splits_thinking(client, model):
    messages = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="x", messages=messages, max_tokens=12, temperature=0)
    want = _greedy(model, model.tokenizer.encode_chat(messages), 12)
    msg = r.choices[0].message
    # The prompt ends inside <think>: the answer is reasoning until a </think>.
    assert msg.reasoning_content == want.text.split("</think>")[0]
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == want.stats.prompt_tokens and r.usage.completion_tokens == 12
    off = client.chat.completions.create(model="x", messages=messages, max_tokens=12, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    want = _greedy(model, model.tokenizer.encode_chat(messages, enable_thinking=False), 12)
    assert off.choices[0].message.content == want.text.lstrip("\n")
    assert getattr(off.choices[0].message, "reasoning_content", None) is None


def test_streaming_equals_the_whole_answer_and_reports_usage(client):
    kwargs = dict(model="x", messages=[{"role": "user", "content": "tell me"}], max_tokens=10, temperature=0,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_completions_with_text_and_ids_seeds_and_stops(client, model):
    r = client.completions.create(model="x", prompt="The sky is", max_tokens=8, temperature=0)
    want = _greedy(model, model.tokenizer.encode("The sky is"), 8)
    assert r.choices[0].text == want.text
    ids = client.completions.create(model="x", prompt=model.tokenizer.encode("The sky is"), max_tokens=8,
                                    temperature=0)
    assert ids.choices[0].text == want.text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="x", prompt="The sky is", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == want.text
    a, b = (client.completions.create(model="x", prompt="Once", max_tokens=8, temperature=0.9, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text
    stop = want.text[3:6]
    cut = client.completions.create(model="x", prompt="The sky is", max_tokens=8, temperature=0, stop=[stop])
    assert cut.choices[0].text == want.text[: want.text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_penalties_and_min_p_reach_the_gpu_sampler(client, model):
    ids = [11, 12, 13, 11, 12, 13, 11, 12]  # greedy repeats tokens after this on the demo checkpoint
    plain = client.completions.create(model="x", prompt=ids, max_tokens=10, temperature=0)
    assert plain.choices[0].text == _greedy(model, ids, 10).text
    options = dict(presence_penalty=1.5, frequency_penalty=0.5)
    extra = {"repetition_penalty": 1.5, "min_p": 0.05}  # not in the openai client's signature
    r = client.completions.create(model="x", prompt=ids, max_tokens=10, temperature=0, extra_body=extra, **options)
    model.reset()
    want = model.generate(ids, max_tokens=10, **options, **extra)
    assert r.choices[0].text == want.text and r.choices[0].text != plain.choices[0].text
    seeded = [client.completions.create(model="x", prompt=ids, max_tokens=10, temperature=1.0, seed=5,
                                        extra_body=extra, **options).choices[0].text for _ in range(2)]
    model.reset()  # top_p and top_k: the demo folder's generation_config.json
    assert seeded[0] == seeded[1] == model.generate(ids, max_tokens=10, temperature=1.0, seed=5, top_p=0.95, top_k=20,
                                                    **options, **extra).text


def _log_softmax_at(model, prompt, tokens):
    """Row i: float64 log-softmax of the raw logits that chose tokens[i] (model.score's)."""
    rows = model.score(prompt + tokens)[len(prompt) - 1:len(prompt) - 1 + len(tokens)].astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))


def _check_entry(model, entry, token, row, top):
    assert entry.token == _token_name(model, token) and entry.bytes == list(model.tokenizer.token_bytes(token))
    assert abs(entry.logprob - row[token]) <= 1e-4, (entry.logprob, row[token])
    want = np.argsort(-row, kind="stable")[:top]
    assert [t.token for t in entry.top_logprobs] == [_token_name(model, int(i)) for i in want]
    np.testing.assert_allclose([t.logprob for t in entry.top_logprobs], row[want], rtol=0, atol=1e-4)


@pytest.mark.parametrize("top", [None, 5])
def test_chat_logprobs_equal_the_log_softmax_of_score(client, model, top):
    messages = [{"role": "user", "content": "hi"}]
    kwargs = dict(model="x", messages=messages, max_tokens=8, temperature=0, logprobs=True)
    if top is not None:
        kwargs["top_logprobs"] = top
    r = client.chat.completions.create(**kwargs)
    prompt = model.tokenizer.encode_chat(messages)
    gen = _greedy(model, prompt, 8)
    tokens = [t for t in gen.tokens if t not in model.eos_token_ids]  # no entry for the eos token
    content = r.choices[0].logprobs.content
    assert len(content) == len(tokens) == r.usage.completion_tokens - (len(gen.tokens) - len(tokens))
    rows = _log_softmax_at(model, prompt, tokens)
    for entry, token, row in zip(content, tokens, rows):
        _check_entry(model, entry, token, row, top or 0)
    # Streamed, the chunks' logprobs add up to the same list (also over text the parser holds back).
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert all(c.choices[0].logprobs is None or c.choices[0].logprobs.content for c in chunks), "no empty lists"


def _token_name(model, token_id: int) -> str:
    """OpenAI's name of a token: its text, or `bytes:` and escapes where its bytes are no text alone."""
    raw = model.tokenizer.token_bytes(token_id)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_token_bytes_are_the_bytes_a_token_stands_for(model):
    text = "Emoji 😀🚀 and 你好, café — Zürich <think>ok</think>"
    ids = model.tokenizer.encode(text)
    pieces = [model.tokenizer.token_bytes(t) for t in ids]
    assert b"".join(pieces) == text.encode() and any(not _is_text(p) for p in pieces), "an emoji split over tokens"


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode()
        return True
    except UnicodeDecodeError:
        return False


def test_logprob_alternatives_of_split_characters_keep_their_own_names(model):
    from metalqwen.model import Chunk
    from metalqwen.server.logprobs import CompletionLogprobs, TokenTexts, chat_logprobs

    first, second = model.tokenizer.encode("😀")  # each half of the emoji's bytes
    texts = TokenTexts(model.tokenizer)
    chunk = Chunk(text="", token=first, logprob=-0.5, top_logprobs=[(first, -0.5), (second, -3.0)])
    legacy = CompletionLogprobs(texts).add([chunk, Chunk(text="😀", token=second, logprob=-0.1, top_logprobs=[])])
    assert legacy["tokens"] == ["bytes:\\xf0\\x9f", "bytes:\\x98\\x80"]
    assert legacy["top_logprobs"][0] == {"bytes:\\xf0\\x9f": -0.5, "bytes:\\x98\\x80": -3.0}, "no collision"
    assert legacy["text_offset"] == [0, 0], "the emoji is one character, at its last token"
    entry = chat_logprobs(texts, [chunk])["content"][0]
    assert entry["bytes"] == [0xF0, 0x9F] and [t["bytes"] for t in entry["top_logprobs"]] == [[0xF0, 0x9F],
                                                                                             [0x98, 0x80]]


def test_completion_logprobs_in_the_legacy_shape(client, model):
    r = client.completions.create(model="x", prompt="The sky is", max_tokens=8, temperature=0, logprobs=3)
    prompt = model.tokenizer.encode("The sky is")
    tokens = [t for t in _greedy(model, prompt, 8).tokens if t not in model.eos_token_ids]
    rows = _log_softmax_at(model, prompt, tokens)
    lp = r.choices[0].logprobs
    raw = [model.tokenizer.token_bytes(t) for t in tokens]
    assert lp.tokens == [_token_name(model, t) for t in tokens]
    assert b"".join(raw).decode("utf-8", "replace") == r.choices[0].text
    np.testing.assert_allclose(lp.token_logprobs, rows[np.arange(len(tokens)), tokens], rtol=0, atol=1e-4)
    # Offsets index the text: a token that is text alone stands there; they never decrease.
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] <= len(r.choices[0].text)
    for name, offset, piece in zip(lp.tokens, lp.text_offset, raw):
        if _is_text(piece):
            assert r.choices[0].text[offset:offset + len(name)] == name, (lp.tokens, lp.text_offset)
    for got, row in zip(lp.top_logprobs, rows):
        want = np.argsort(-row, kind="stable")[:3]
        assert list(got) == [_token_name(model, int(i)) for i in want]
        np.testing.assert_allclose(list(got.values()), row[want], rtol=0, atol=1e-4)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in client.completions.create(model="x", prompt="The sky is", max_tokens=8, temperature=0, logprobs=3,
                                       stream=True):
        if c.choices and c.choices[0].logprobs:
            for key in streamed:
                streamed[key] += getattr(c.choices[0].logprobs, key)
    assert streamed == {key: getattr(lp, key) for key in streamed}
    plain = client.completions.create(model="x", prompt="The sky is", max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == r.choices[0].text


def test_logprobs_out_of_range_are_400_naming_the_field(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", r.text


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages.0"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]},
     "messages.0.content"),
    # The demo model has no vision tower (images: tests/vision/test_server_images.py).
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "word " * 600}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}, "tools.0.function.parameters"),
    # OpenAI fields that would change the output and are not done yet: refused, never ignored.
    ({"messages": [{"role": "user", "content": "hi"}], "best_of": 3}, "best_of"),
    ({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]}, "modalities"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 5}, "n"),  # more choices than the queue takes (4)
    ({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "hi"}], "web_search_options": {}}, "web_search_options"),
    ({"messages": [{"role": "user", "content": "hi"}], "moderation": {"model": "omni-moderation-latest"}},
     "moderation"),
    ({"messages": [{"role": "user", "content": "hi"}], "verbosity": "low"}, "verbosity"),
    ({"messages": [{"role": "user", "content": "hi"}], "prediction": {"type": "content", "content": "x"}},
     "prediction"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param:
        assert error["param"] == param, error


def test_reasoning_effort_turns_thinking_off_and_unknown_fields_are_ignored(client):
    messages = [{"role": "user", "content": "hi"}]
    off = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0,
                                         reasoning_effort="none", extra_body={"some_future_field": 1})
    on = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0,
                                        reasoning_effort="xhigh", extra_body={"verbosity": "medium"})
    # Thinking off: the template closes the thinking block in the prompt, so the answer is content.
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    assert not getattr(off.choices[0].message, "reasoning_content", None) and on.choices[0].message.reasoning_content


def test_malformed_requests_then_a_normal_one(server, client):
    for raw in (b"{", b"[]", b'{"messages": "hi"}', b"\xff\xfe", b""):
        r = httpx.post(server.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        error = r.json()["error"]  # OpenAI's shape, in its words: no pydantic or FastAPI wording
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert "Value error" not in error["message"] and error["param"] != "0", error
    assert "not valid JSON" in httpx.post(server.url + "/v1/chat/completions", content=b"{",
                                          headers={"content-type": "application/json"}).json()["error"]["message"]
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405)):
        r = httpx.request(method, server.url + path)
        assert r.status_code == status and r.json()["error"]["message"].startswith(f"{method} {path}: "), r.text
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens == 3


def test_a_client_gone_mid_stream_stops_the_engine(server, model, client):
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    time.sleep(1.0)
    steps = model.counters()["steps"]
    time.sleep(1.5)
    assert model.counters()["steps"] == steps, "the engine kept decoding for a client that left"
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("slots", [1, 2], ids=["one-slot", "batched"])
def test_a_client_gone_mid_stream_still_counts_its_tokens(server, demo, device, slots):
    # One slot: the worker's plain loop; several (serve's default): the scheduler's cancel.
    live = server if slots == 1 else LiveServer(create_app(
        metalqwen.load(demo, device=device, max_context=512, progress=False, max_sequences=slots)))

    def generated() -> float:
        text = httpx.get(live.url + "/metrics").text
        return next(float(line.split()[1]) for line in text.splitlines()
                    if line.startswith("metalqwen_generated_tokens_total "))

    try:
        before = generated()
        body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=60) as r:
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            for _ in range(6):  # the header, then 5 chunks of at least a token each
                next(events)
        deadline = time.monotonic() + 60
        while generated() == before:
            assert time.monotonic() < deadline, "the disconnected request's tokens were never counted"
            time.sleep(0.2)
        assert 5 <= generated() - before < 400
    finally:
        if live is not server:
            live.close()


def test_metrics_count_requests_and_tokens(server, client):
    client.completions.create(model="x", prompt="Hello", max_tokens=4, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
    assert values["metalqwen_requests_total"] >= 1 and values["metalqwen_generated_tokens_total"] >= 4
    assert values["metalqwen_engine_steps_total"] > 0 and values["metalqwen_queue_depth"] == 0


def test_api_key_and_a_full_queue(model):
    live = LiveServer(create_app(model, api_key="secret", max_queue=0))
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(live.url + "/v1/chat/completions", json=body).status_code == 401
        assert httpx.get(live.url + "/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
        # Liveness probes need no key; /metrics does unless the server was told otherwise.
        assert httpx.get(live.url + "/health").status_code == 200
        assert httpx.get(live.url + "/metrics").status_code == 401
        ok = {"authorization": "Bearer secret"}
        assert httpx.get(live.url + "/v1/models", headers=ok).status_code == 200
        full = httpx.post(live.url + "/v1/chat/completions", json=body, headers=ok)
        assert full.status_code == 429 and full.json()["error"]["type"] == "rate_limit_error"
    finally:
        live.close()


def test_public_metrics_cors_and_one_log_line_per_request(model, caplog):
    import logging

    live = LiveServer(create_app(model, api_key="secret", public_metrics=True, cors_origins=["http://app.test"]))
    try:
        assert httpx.get(live.url + "/metrics").status_code == 200
        preflight = httpx.options(live.url + "/v1/chat/completions", headers={
            "origin": "http://app.test", "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://app.test"
        other = httpx.options(live.url + "/v1/chat/completions", headers={
            "origin": "http://elsewhere.test", "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in other.headers
        with caplog.at_level(logging.INFO, logger="metalqwen.server"):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
            with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=120,
                              headers={"authorization": "Bearer secret"}) as r:
                assert r.status_code == 200 and list(r.iter_lines())
            deadline = time.monotonic() + 30
            while not any("generated" in m for m in caplog.messages):
                assert time.monotonic() < deadline, caplog.messages
                time.sleep(0.05)
        line = next(m for m in caplog.messages if m.startswith("POST /v1/chat/completions 200"))
        assert "prompt " in line and "(cached 0)" in line and "generated 3" in line and "first token" in line
        assert "tok/s" in line
    finally:
        live.close()
    cors_off = LiveServer(create_app(model))
    try:
        r = httpx.options(cors_off.url + "/v1/chat/completions", headers={
            "origin": "http://app.test", "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in r.headers, "CORS is off by default"
    finally:
        cors_off.close()


def test_omitted_sampling_fields_take_the_generation_config(client, model, demo):
    with open(f"{demo}/generation_config.json") as f:
        qwen = json.load(f)  # the demo ships Qwen's recommended settings
    r = client.completions.create(model="x", prompt="Once", max_tokens=8, seed=5)
    model.reset()
    want = model.generate("Once", max_tokens=8, seed=5, temperature=qwen["temperature"], top_p=qwen["top_p"],
                          top_k=qwen["top_k"])
    assert r.choices[0].text == want.text
    model.reset()
    assert want.text != model.generate("Once", max_tokens=8, temperature=0).text  # not greedy


@pytest.mark.parametrize("log_level", [[], ["--log-level", "warning"]], ids=["default", "warning"])
def test_the_serve_command_answers_logs_and_stops_on_ctrl_c(demo, device, log_level):
    import signal
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "metalqwen.cli", "serve", "-m", demo, "--device", device.kind,
                             "--port", str(port), "--max-context", "256", *log_level], stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        said = proc.stderr.readline()  # nothing else is printed before it (no progress off a terminal)
        assert "serving " in said and "4 sequence slot(s) of 256 tokens" in said, said + proc.stderr.read()
        # Said only once the socket listens: the first request is answered.
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        said += proc.stderr.read()
        assert "Traceback" not in said
        # A line per request on stderr at the default level; --log-level warning keeps only errors.
        assert ("metalqwen: GET /health 200 " in said) == (not log_level), said
    finally:
        proc.kill()
        proc.stderr.close()


def test_the_next_chat_turn_resumes_from_the_prefix_cache(demo, device):
    openai = require("openai")
    m = metalqwen.load(demo, device=device, max_context=512, prefix_cache_bytes=64 << 20, progress=False)
    live = LiveServer(create_app(m))
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
        turn = [{"role": "user", "content": "hi there"}]
        first = client.chat.completions.create(model="x", messages=turn, max_tokens=6, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        answer = first.choices[0].message
        turn += [{"role": "assistant", "content": answer.content or "", "reasoning_content": answer.reasoning_content},
                 {"role": "user", "content": "and then?"}]
        second = client.chat.completions.create(model="x", messages=turn, max_tokens=6, temperature=0)
        # The template drops the first answer's thinking: the hit is at the end of the first user turn.
        end_of_user = len(m.tokenizer.encode(m.tokenizer.apply_chat_template(turn[:1], add_generation_prompt=False)))
        assert second.usage.prompt_tokens_details.cached_tokens == end_of_user
        cold = metalqwen.load(demo, device=device, max_context=512, progress=False)
        want = cold.generate(m.tokenizer.encode_chat(turn), max_tokens=6)
        assert second.choices[0].message.reasoning_content == want.text
        metrics = httpx.get(live.url + "/metrics").text
        assert "metalqwen_prefix_cache_entries" in metrics and "metalqwen_cache_hits_total 1" in metrics
    finally:
        live.close()


def test_a_speculative_server_answers_as_a_plain_one(demo, device, client):
    """Greedy answers do not depend on speculation; /metrics counts the verify steps."""
    openai = require("openai")
    m = metalqwen.load(demo, device=device, max_context=512, progress=False, speculative="lookup")
    live = LiveServer(create_app(m))
    try:
        fast = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
        prompt = "one two three four one two three four one two three"
        got = fast.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0)
        want = client.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0)
        assert got.choices[0].text == want.choices[0].text
        metrics = httpx.get(live.url + "/metrics").text
        assert f"metalqwen_verify_steps_total {m.counters()['verify_steps']}" in metrics
        assert "metalqwen_accepted_tokens_total" in metrics
    finally:
        live.close()


def test_concurrent_clients_share_steps_and_get_their_sequential_answers(demo, device, client):
    """8 clients at once on 4 sequence slots: each answer equals the one-at-a-time server's,
    and /metrics shows fewer engine steps than generated tokens."""
    import concurrent.futures

    openai = require("openai")
    m = metalqwen.load(demo, device=device, max_context=512, progress=False, max_sequences=4)
    live = LiveServer(create_app(m, max_queue=8))
    try:
        batched = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
        asks = [dict(prompt=f"Tell me about {w}", max_tokens=6 + i % 4, temperature=0.7 * (i % 2), seed=i)
                for i, w in enumerate("rivers cats maps tea snow bells ink moss".split())]
        want = [client.completions.create(model="x", **a).choices[0].text for a in asks]
        with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
            got = list(pool.map(lambda a: batched.completions.create(model="x", **a).choices[0].text, asks))
        assert got == want
        text = httpx.get(live.url + "/metrics").text
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
        assert values["metalqwen_engine_steps_total"] < values["metalqwen_generated_tokens_total"]
        assert values["metalqwen_engine_pipelined_steps_total"] > 0  # the next shared step committed ahead
    finally:
        live.close()


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_the_answers_of_seeds_seed_to_seed_plus_n(client, stream):
    """n = 3 sampled choices: choice i is the single answer seeded seed + i; a stream interleaves
    them, each choice ending with its own finish_reason; usage counts the prompt once."""
    ask = dict(model="x", prompt="Once upon", max_tokens=6, temperature=0.9)
    want = [client.completions.create(seed=7 + i, **ask) for i in range(3)]
    if stream:
        chunks = list(client.completions.create(seed=7, n=3, stream=True, stream_options={"include_usage": True},
                                                **ask))
        texts, finish = ["", "", ""], [None] * 3
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.text
                finish[ch.index] = ch.finish_reason or finish[ch.index]
        usage = chunks[-1].usage
    else:
        r = client.completions.create(seed=7, n=3, **ask)
        assert [ch.index for ch in r.choices] == [0, 1, 2]
        texts, finish, usage = [ch.text for ch in r.choices], [ch.finish_reason for ch in r.choices], r.usage
    assert texts == [w.choices[0].text for w in want]
    assert len(set(texts)) > 1, "different seeds, different samples"
    assert finish == [w.choices[0].finish_reason for w in want]
    assert usage.prompt_tokens == want[0].usage.prompt_tokens
    assert usage.completion_tokens == sum(w.usage.completion_tokens for w in want)


def test_n_chat_choices_in_shared_steps(demo, device, client):
    """Chat with n = 2 on a server with 2 sequence slots: each choice equals its seed's single answer."""
    openai = require("openai")
    m = metalqwen.load(demo, device=device, max_context=512, progress=False, max_sequences=2)
    live = LiveServer(create_app(m, max_queue=4))
    try:
        batched = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
        ask = dict(model="x", messages=[{"role": "user", "content": "a story"}], max_tokens=6, temperature=0.8)
        want = [client.chat.completions.create(seed=3 + i, **ask).choices[0].message for i in range(2)]
        got = batched.chat.completions.create(seed=3, n=2, **ask).choices
        assert [(c.message.content, getattr(c.message, "reasoning_content", None)) for c in got] == \
            [(w.content, getattr(w, "reasoning_content", None)) for w in want]
    finally:
        live.close()
