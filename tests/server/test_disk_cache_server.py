"""A server restarted on the same --cache-dir resumes a long system prompt from its files: the
answer is a cold run's, /metrics counts the disk's hits, writes and bytes."""

from __future__ import annotations

import httpx

import metalqwen
from metalqwen.server import create_app

from ..support.require import require
from ..support.server_fixtures import LiveServer

SYSTEM = "You are a careful assistant. " * 12


def _serve_once(model, question: str):
    """(the greedy answer to SYSTEM + question, tokens taken from the cache, /metrics) of one request."""
    openai = require("openai")
    live = LiveServer(create_app(model))
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
        r = client.chat.completions.create(model="x", max_tokens=6, temperature=0, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        model.prefix_cache.disk.flush(60)
        return r.choices[0].message, r.usage.prompt_tokens_details.cached_tokens, httpx.get(live.url + "/metrics").text
    finally:
        live.close()


def test_a_restarted_server_resumes_the_system_prompt_from_disk(demo, device, tmp_path):
    load = lambda **kw: metalqwen.load(demo, device=device, max_context=512, progress=False, **kw)  # noqa: E731
    folder = str(tmp_path / "cache")
    _, cached, metrics = _serve_once(load(prefix_cache_bytes=64 << 20, cache_dir=folder), "first question")
    assert cached == 0 and "metalqwen_disk_cache_hits_total 0" in metrics
    assert "metalqwen_disk_cache_writes_total 0" not in metrics and "metalqwen_disk_cache_bytes 0" not in metrics
    # Batched this time (the scheduler's path): snapshots do not depend on the engine's slots.
    restarted = load(prefix_cache_bytes=64 << 20, cache_dir=folder, max_sequences=2)
    answer, cached, metrics = _serve_once(restarted, "second question")
    system_end = len(restarted.tokenizer.encode(restarted.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}], add_generation_prompt=False)))
    assert cached == system_end and "metalqwen_disk_cache_hits_total 1" in metrics
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "second question"}]
    cold = load().generate(restarted.tokenizer.encode_chat(messages), max_tokens=6)
    assert (answer.reasoning_content or "") + (answer.content or "") == cold.text
