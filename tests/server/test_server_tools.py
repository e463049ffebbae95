"""A tool-call round trip through the server with the official client. Random weights never
write a tool call, so generation is replaced by a script (the forced-token hook of this test):
what is under test is the server's side — tools rendered into the prompt, the streamed XML call
parsed into `tool_calls` (arguments typed by the schema), the tool's result rendered back."""

from __future__ import annotations

import json
import time

import pytest

import metalqwen
from metalqwen.model import Chunk, GenerationStats
from metalqwen.server import create_app

from ..support.require import require
from ..support.server_fixtures import LiveServer

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
CALL = ("Let me look that up.</think>\n\n<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


@pytest.fixture
def scripted(demo, device):
    """A live server whose model answers with ``script[i]`` for the i-th request, split into
    3-character chunks; ``prompts`` records the token ids each request was given."""
    model = metalqwen.load(demo, device=device, max_context=512, progress=False)
    script, prompts = [], []
    model.unread = None  # chunks of the last script left unread when the server stopped generating

    def stream(ids, max_tokens=256, **options):
        prompts.append(list(ids))
        text = script[len(prompts) - 1]
        model.last_stats = GenerationStats(prompt_tokens=len(ids), generated_tokens=len(text) // 3 + 1)
        model.last_finish_reason = "stop"
        chunks = [text[i: i + 3] for i in range(0, len(text), 3)]
        try:
            for i, piece in enumerate(chunks):
                model.unread = len(chunks) - i
                yield Chunk(text=piece, token=None)
                if "</tool_call>" in text[: 3 * i + 3]:
                    time.sleep(0.05)  # a model's pace after a call: time for the server to stop it
            model.unread = 0
        except GeneratorExit:
            pass

    model.stream = stream
    live = LiveServer(create_app(model))
    yield live, model, script, prompts
    live.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip(scripted, stream):
    openai = require("openai")
    live, model, script, prompts = scripted
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
    script += [CALL, "It will be sunny.</think>\n\nSunny for three days."]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        chunks = list(client.chat.completions.create(model="x", messages=messages, tools=[WEATHER], stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        call = calls[0].function
        call_id = calls[0].id
    else:
        r = client.chat.completions.create(model="x", messages=messages, tools=[WEATHER])
        reasoning, content = r.choices[0].message.reasoning_content, r.choices[0].message.content
        finish, call, call_id = r.choices[0].finish_reason, r.choices[0].message.tool_calls[0].function, \
            r.choices[0].message.tool_calls[0].id
        calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and finish == "tool_calls"
    assert reasoning == "Let me look that up." and not content
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Paris", "days": 3}
    assert "weather" in model.tokenizer.decode(prompts[0]), "the tools are rendered into the prompt"

    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "sunny"}'}]
    r = client.chat.completions.create(model="x", messages=messages, tools=[WEATHER])
    assert r.choices[0].message.content == "Sunny for three days." and r.choices[0].finish_reason == "stop"
    second = model.tokenizer.decode(prompts[1])
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in second
    assert "<function=weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n" in second, \
        "the call is rendered back with its arguments"


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(scripted):
    openai = require("openai")
    live, model, script, prompts = scripted
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
    script.append(CALL)
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
                                       tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
    assert "weather" not in model.tokenizer.decode(prompts[0])


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_ends_the_answer_at_the_first_call(scripted, stream):
    openai = require("openai")
    live, model, script, prompts = scripted
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
    second = "\n<tool_call>\n<function=weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
    tail = " and then a long answer nobody reads" * 20
    script.append(CALL + second + tail)
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Paris and Rome?"}],
                                       tools=[WEATHER], parallel_tool_calls=False, stream=stream)
    if stream:
        chunks = [c for c in r if c.choices]
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        calls, content, finish = r.choices[0].message.tool_calls, r.choices[0].message.content, \
            r.choices[0].finish_reason
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris", "days": 3}]
    assert finish == "tool_calls" and not content
    # Generation stopped at the first call instead of running to the end of the script.
    assert model.unread > 0
