"""Structured output, logit_bias and forced tool calls through `metalqwen serve` (shared steps:
max_sequences 2) with the official `openai` client, on the demo checkpoint's random weights:

- response_format json_schema on chat (streamed and not: the same answer), also after a
  thinking block (its end forced by logit_bias), parses and validates; json_object on
  /v1/completions gives an object;
- logit_bias: -100 on the greedy token gives numpy's argmax of the biased model.score row,
  +100 forces a token;
- tool_choice "required" and a named function answer with a tool call (its arguments valid
  against the tool's parameters), streamed and not;
- what cannot be honoured is a 400 naming the field.

The schemas bound every value and keep JSON compact ("x-guidance"), or random weights would
write whitespace forever."""

from __future__ import annotations

import json

import httpx
import jsonschema
import numpy as np
import pytest

import metalqwen


SCHEMA = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Oslo", 'Qu\u00e9bec "QC"']},
    "days": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
    "note": {"type": "string", "maxLength": 4}},
    "required": ["city", "days", "note"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["unit", "days"]}}},
    {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["utc", "cet"]}}, "required": ["zone"]}}},
]
NO_THINKING = dict(reasoning_effort="none", temperature=0)


@pytest.fixture(scope="module")
def model(demo, device):
    # The tools' prompt is ~480 tokens: room for it, and the prefix cache so the second reads only its end.
    return metalqwen.load(demo, device=device, max_context=640, progress=False, max_sequences=2,
                          prefix_cache_bytes=2**26)


def messages(text="Weather in Paris?"):
    return [{"role": "user", "content": text}]


def test_chat_json_schema_streamed_or_not_validates(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
    whole = client.chat.completions.create(model="x", messages=messages(), response_format=fmt, max_tokens=60,
                                           **NO_THINKING)
    assert whole.choices[0].finish_reason == "stop"
    answer = whole.choices[0].message.content
    jsonschema.validate(json.loads(answer), SCHEMA)
    chunks = client.chat.completions.create(model="x", messages=messages(), response_format=fmt, max_tokens=60,
                                            stream=True, **NO_THINKING)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer


def test_chat_json_schema_after_thinking(client, model):
    # Thinking on: the grammar lets reasoning come first; </think> biased up ends it at once.
    close = model.tokenizer.token_to_id("</think>")
    r = client.chat.completions.create(
        model="x", messages=messages(), max_tokens=60, temperature=0, logit_bias={str(close): 100},
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    assert not getattr(r.choices[0].message, "reasoning_content", None)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_completions_json_object(client, model):
    # Flexible whitespace: "}" biased up closes the object as soon as the grammar allows it.
    close = model.tokenizer.encode("}")[0]
    r = client.completions.create(model="x", prompt="An object:", max_tokens=8, temperature=0,
                                  logit_bias={str(close): 100}, extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].text == "{}" and r.choices[0].finish_reason == "stop"


def test_logit_bias_moves_and_forces_tokens(client, model):
    prompt = [31, 7, 200, 45, 9]
    row = model.score(prompt)[-1]
    greedy = int(np.argmax(row))
    biased = row.copy()
    biased[greedy] -= 100
    moved = client.completions.create(model="x", prompt=prompt, max_tokens=1, temperature=0, logprobs=0,
                                      logit_bias={str(greedy): -100})
    assert moved.choices[0].text == model.tokenizer.decode([int(np.argmax(biased))])
    forced = client.completions.create(model="x", prompt=prompt, max_tokens=3, temperature=0.8, seed=1,
                                       logit_bias={"77": 100})
    assert forced.choices[0].text == model.tokenizer.decode([77] * 3)


@pytest.mark.parametrize("choice, stream", [("required", False), ("clock", True)])
def test_tool_choice_answers_with_a_tool_call(client, choice, stream):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    options = dict(model="x", messages=messages(), tools=TOOLS, tool_choice=tool_choice, max_tokens=60,
                   parallel_tool_calls=False, **NO_THINKING)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **options))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        name, arguments = calls[0].function.name, "".join(tc.function.arguments or "" for tc in calls)
    else:
        r = client.chat.completions.create(**options)
        calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        name, arguments = calls[0].function.name, calls[0].function.arguments
    assert finish == "tool_calls" and len({tc.index for tc in calls} if stream else calls) == 1
    tool = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
    assert choice in ("required", name)
    jsonschema.validate(json.loads(arguments), tool["parameters"])


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 3}}}},
     "response_format"),
    ({"logit_bias": {"5": 150}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"best_of": 2}, "best_of"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages(), **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
