"""The chat page at / in headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium): a message streams an answer, Stop ends it (and the generation), New chat clears."""

from __future__ import annotations

import os
import time

import httpx
import pytest

import metalqwen
from metalqwen.server import create_app

from ..support.browser import chromium, until
from ..support.server_fixtures import LiveServer, metrics


@pytest.fixture(scope="module")
def browser():
    b = chromium()
    yield b
    b.quit()


@pytest.fixture(scope="module")
def model(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, progress=False)


def _answer(browser) -> str:
    """The last answer's thinking and text as streamed so far."""
    boxes = browser.find_elements("css selector", ".message.assistant")
    if not boxes:
        return ""
    return "".join(e.get_attribute("textContent") for e in boxes[-1].find_elements("css selector", ".thought, .content"))


def _conversation(browser) -> list[str]:
    """Each message's text: the user's, and each answer's thinking and content."""
    return [e.get_attribute("textContent") if "user" in e.get_attribute("class") else
            "|".join(p.get_attribute("textContent") for p in e.find_elements("css selector", ".thought, .content"))
            for e in browser.find_elements("css selector", ".message")]


def _reading(browser) -> str:
    found = browser.find_elements("css selector", ".message.assistant .reading")
    return found[-1].text if found else ""


def test_the_page_streams_an_answer_stops_it_and_starts_a_new_chat(browser, model):
    live = LiveServer(create_app(model, api_key="secret"))
    try:
        assert httpx.get(live.url + "/").headers["content-type"].startswith("text/html")  # no key needed
        browser.get(live.url + "/")
        find = lambda css: browser.find_element("css selector", css)  # noqa: E731
        # No key yet: said beside the key field, not in place of the model name.
        until(lambda: find("#key-hint").is_displayed(), "the key hint")
        assert "needs an API key" in find("#key-hint").text and find("#model").text == "metalqwen"
        find("#api-key").send_keys("wrong")
        find("#new-chat").click()  # leaves the key field: the page stores it and asks for the model
        until(lambda: find("#key-hint").text == "wrong API key", "the wrong-key hint")
        find("#api-key").clear()
        find("#api-key").send_keys("secret")
        find("#new-chat").click()
        until(lambda: find("#model").text == os.path.basename(model.checkpoint.path), "the model name")
        assert not find("#key-hint").is_displayed()
        # A favicon of its own (no request for /favicon.ico), the thinking box beside its label.
        assert find("link[rel=icon]").get_attribute("href").startswith("data:image/svg+xml")
        box, label = find("#thinking"), find("label:has(#thinking)")
        assert box.size["width"] < 30 and label.size["width"] < 150, (box.size, label.size)

        find("#prompt").send_keys("tell me a long story " * 20 + "\n")
        # Until the first token the answer says how much it reads.
        until(lambda: "prompt tokens..." in _reading(browser), "the reading indicator")
        # Streamed: text shows while the answer is still running (Stop enabled).
        until(lambda: len(_answer(browser)) > 5 and find("#stop").is_enabled(), "streamed text")
        find("#stop").click()
        until(lambda: find("#send").is_enabled(), "the page to take the stop")
        # The aborted fetch closes the connection and the server ends the job (its tokens are then counted),
        # long before the answer would have run out of context (max_context 512).
        ended = until(lambda: (m := metrics(live.url, "secret"))["generated_tokens_total"] and m, "the server to end the job")
        assert ended["generated_tokens_total"] < (512 - ended["prompt_tokens_total"]) / 2, ended
        steps, stopped = model.counters()["steps"], _answer(browser)
        time.sleep(1.0)
        assert model.counters()["steps"] == steps, "the engine kept decoding after Stop"
        assert _answer(browser) == stopped and "stopped" in find(".message.assistant .stats").text

        find("#new-chat").click()
        assert browser.find_elements("css selector", ".message") == []
        find("#max-tokens").send_keys("6")
        find("#prompt").send_keys("hi\n")
        stats = until(lambda: (s := browser.find_elements("css selector", ".message.assistant .stats"))
                       and s[0].text, "the answer's statistics")
        assert "6 tokens" in stats and "tok/s" in stats and "prompt tokens reused" in stats, stats
        assert len(browser.find_elements("css selector", ".message")) == 2
        assert _reading(browser) == "", "the indicator leaves with the first token"
        # The conversation survives a reload; New chat forgets it.
        shown = _conversation(browser)
        browser.refresh()
        until(lambda: len(browser.find_elements("css selector", ".message")) == 2, "the restored conversation")
        assert _conversation(browser) == shown and shown[0] == "hi"
        find("#new-chat").click()
        browser.refresh()
        until(lambda: find("#model").text == os.path.basename(model.checkpoint.path), "the reloaded page")
        assert browser.find_elements("css selector", ".message") == []
    finally:
        live.close()
