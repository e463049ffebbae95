"""Images through `metalqwen serve` on the tiny VLM folder, with the official `openai` client: an
image_url part's answer equals Model.generate on the same messages (greedy, streamed too, also
beside a text request on a batching server), usage counts the image tokens, and every refusal is
a 400 naming the field (docs/server.md, "Images")."""

from __future__ import annotations

import base64
import functools
import http.server
import io
import os
import threading

import httpx
import pytest

import metalqwen
from metalqwen.server import create_app
from metalqwen.server.image_parts import ImagePolicy

from ..support.require import require
from ..support.server_fixtures import LiveServer
from .conftest import picture


def png(h: int, w: int, seed: int = 0) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(picture(h, w, seed)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def asking(url: str, text: str = "What is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def model(vlm, device):
    # Two slots: image requests batch with the others.
    return metalqwen.load(vlm(), device=device, max_context=256, kv_bits=16, progress=False, max_sequences=2)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """A directory the server may read (with a symlink out of it), and a file outside it."""
    root = tmp_path_factory.mktemp("images")
    allowed, outside = root / "allowed", root / "outside.png"
    allowed.mkdir()
    (allowed / "cat.png").write_bytes(png(70, 90, seed=3))
    (allowed / "big.png").write_bytes(png(200, 200))  # more bytes than the test server downloads
    outside.write_bytes(png(70, 90, seed=3))
    os.symlink(outside, allowed / "link.png")
    return allowed, outside


@pytest.fixture(scope="module")
def web(pictures):
    """A plain http server over the allowed directory (what --fetch-images downloads from)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(pictures[0]))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def server(model, pictures):
    policy = ImagePolicy(allowed_dir=str(pictures[0]), fetch=True, max_images=2, max_pixels=300 * 300,
                         fetch_bytes=len(png(70, 90, seed=3)) + 10, fetch_seconds=5)
    live = LiveServer(create_app(model, max_queue=4, images=policy))
    yield live
    live.close()


@pytest.fixture(scope="module")
def client(server):
    return require("openai").OpenAI(base_url=server.url + "/v1", api_key="unused")


def ask(client, messages, max_tokens=6, **kw):
    return client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_body=NO_THINK, **kw)


def alone(model, messages, max_tokens=6):
    """Model.generate's answer (text, prompt tokens) to the messages, with the server's template options."""
    g = model.generate(messages, max_tokens=max_tokens, enable_thinking=False)
    return g.text, g.stats.prompt_tokens


def test_an_image_answer_equals_generate_streamed_too(model, client, server):
    """Also: the server's requests take the picture's features from the tower's cache (the tower ran
    for it once, in Model.generate), as /metrics counts."""
    messages = asking(data_url(png(64, 96)))
    want, prompt_tokens = alone(model, messages)
    runs, reused = model.counters()["vision_tower_runs"], model.counters()["vision_features_reused"]
    text_only = len(model.prompt_ids([{"role": "user", "content": "What is this?"}], enable_thinking=False))
    # 64 x 96 pixels: 4 x 6 patches, merged 2 x 2 into 6 image tokens in place of one text token.
    assert prompt_tokens == text_only + 2 + 6
    r = ask(client, messages)
    assert r.choices[0].message.content == want
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_tokens, 6)
    chunks = list(ask(client, messages, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.prompt_tokens == prompt_tokens
    metrics = httpx.get(server.url + "/metrics").text
    assert f"metalqwen_vision_tower_runs_total {runs}\n" in metrics
    assert f"metalqwen_vision_features_reused_total {reused + 2}\n" in metrics


def test_an_image_request_beside_a_text_one(model, client):
    """An image request and a text one batched on a two-slot server: each answer is its own alone."""
    image, text = asking(data_url(png(80, 80, seed=1))), [{"role": "user", "content": "tell me a story"}]
    want = [alone(model, image, 8)[0], alone(model, text, 8)[0]]
    got = [None, None]

    def run(i, messages):
        got[i] = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                                extra_body=NO_THINK).choices[0].message.content

    threads = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate((image, text))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_local_files_and_fetched_urls(model, client, pictures, web):
    want = alone(model, asking(data_url(png(70, 90, seed=3))), 2)[0]
    for url in ("file://" + str(pictures[0] / "cat.png"), web + "/cat.png"):  # (a plain path: in the refusals)
        assert ask(client, asking(url), 2).choices[0].message.content == want, url


def refusal(server, messages) -> tuple[str, str]:
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    return error["param"], error["message"]


def test_what_is_refused(server, pictures, web):
    field = "messages[1].content[1].image_url.url"

    def second(url):  # the image as the second part of the second message
        return [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]

    cases = [
        (data_url(b"not a picture"), "not a decodable image"),
        ("data:image/png;base64,@@@", "not valid base64"),
        (data_url(png(301, 300)), "300 x 301 pixels, more than the 90000"),
        (str(pictures[1]), "outside the allowed image directory"),
        (str(pictures[0] / "link.png"), "outside the allowed image directory"),  # a symlink out of it
        (str(pictures[0] / "missing.png"), "is not a file"),
        (web + "/missing.png", "HTTP 404"),
        (web + "/big.png", "is larger than"),
    ]
    for url, said in cases:
        param, message = refusal(server, second(url))
        assert param == field and said in message and message.startswith(field), (url, message)
    param, message = refusal(server, asking(data_url(png(40, 40))) * 3)
    assert param == "messages" and "3 images exceed the 2" in message
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "low"}}]}]
    assert refusal(server, bad)[0] == "messages[0].content[0].image_url.url"


def test_what_a_stricter_server_refuses(model, pictures, web):
    """Defaults: no local files, no downloads; a text-only model takes no images."""
    live = LiveServer(create_app(model))
    try:
        assert "--allowed-image-dir" in refusal(live, asking(str(pictures[0] / "cat.png")))[1]
        assert "--fetch-images" in refusal(live, asking(web + "/cat.png"))[1]
    finally:
        live.close()


def test_a_model_without_a_vision_tower(demo, device):
    text_only = metalqwen.load(demo, device=device, max_context=64, progress=False)
    live = LiveServer(create_app(text_only))
    try:
        param, message = refusal(live, asking(data_url(png(40, 40))))
        assert param == "messages[0].content[0]" and "takes no images" in message
    finally:
        live.close()


def test_the_chat_page_attaches_an_image(vlm, device, pictures, tmp_path):
    """The page's Image button sends the chosen file as a data: URL image_url part with the next
    message: the answer is Model.generate's on the same picture and text; the picture shows in the
    conversation, also after a reload."""
    import json
    import shutil

    from ..support.browser import chromium, until

    # The page sends no temperature: a folder whose generation_config.json says greedy.
    folder = shutil.copytree(vlm(), tmp_path / "greedy")
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    model = metalqwen.load(folder, device=device, max_context=256, kv_bits=16, progress=False)
    path = str(pictures[0] / "cat.png")
    want, prompt_tokens = alone(model, asking(data_url(png(70, 90, seed=3)), "What is it?"), 4)
    browser = chromium()
    live = LiveServer(create_app(model))
    try:
        browser.get(live.url + "/")
        find = lambda css: browser.find_element("css selector", css)  # noqa: E731
        find("#thinking").click()  # off: the answer is all content
        find("#max-tokens").send_keys("4")
        find("#image-file").send_keys(path)
        until(lambda: browser.find_elements("css selector", "#attached img"), "the attached thumbnail")
        find("#prompt").send_keys("What is it?\n")
        stats = until(lambda: (s := browser.find_elements("css selector", ".message.assistant .stats"))
                      and s[0].text, "the answer's statistics")
        assert f"of {prompt_tokens} prompt tokens" in stats, stats
        assert find(".message.assistant .content").get_attribute("textContent") == want
        assert find(".message.user img").get_attribute("src").startswith("data:image/png;base64,")
        assert find(".message.user").text == "What is it?" and not browser.find_elements("css selector",
                                                                                          "#attached img")
        browser.refresh()
        until(lambda: browser.find_elements("css selector", ".message.user img"), "the restored picture")
    finally:
        live.close()
        browser.quit()
