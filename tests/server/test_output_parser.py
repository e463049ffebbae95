"""The server's answer splitter: reasoning, content and tool calls, the same whether the
text arrives whole or split at every character."""

from __future__ import annotations

import json

import pytest

from metalqwen.server.output_parser import Delta, OutputParser

WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "zip": {"type": "string"}}}}}]


def _run(text: str, pieces: list[str], in_reasoning: bool, tools=None, max_calls=None) -> Delta:
    parser = OutputParser(in_reasoning, tools, max_calls)
    total = Delta()
    for piece in pieces:
        d = parser.feed(piece)
        total.reasoning += d.reasoning
        total.content += d.content
        total.tool_calls += d.tool_calls
    d = parser.finish()
    total.reasoning += d.reasoning
    total.content += d.content
    total.tool_calls += d.tool_calls
    return total


def _every_split(text: str, in_reasoning: bool, tools=None, max_calls=None) -> Delta:
    """Parses ``text`` whole, one character at a time and split at every position; all must agree."""
    whole = _run(text, [text], in_reasoning, tools, max_calls)
    ways = [list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for pieces in ways:
        got = _run(text, pieces, in_reasoning, tools, max_calls)
        assert (got.reasoning, got.content) == (whole.reasoning, whole.content), pieces
        assert [(c.name, c.arguments) for c in got.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    return whole


def test_thinking_goes_to_reasoning_and_never_into_content():
    d = _every_split("Let me think.\nOK.</think>\n\nThe answer is 4.", in_reasoning=True)
    assert d.reasoning == "Let me think.\nOK." and d.content == "The answer is 4." and not d.tool_calls


def test_without_thinking_everything_is_content_and_a_late_think_block_is_reasoning():
    assert _every_split("Plain answer <b>bold</b>.", in_reasoning=False).content == "Plain answer <b>bold</b>."
    d = _every_split("<think>hmm</think>\n\nDone", in_reasoning=False)
    assert d.reasoning == "hmm" and d.content == "Done"


def test_an_unfinished_tag_at_the_end_is_text():
    d = _every_split("a </thi", in_reasoning=True)
    assert d.reasoning == "a </thi" and d.content == ""


def test_qwen35_xml_tool_calls_are_parsed_and_typed_by_the_schema():
    text = ("I will check.</think>\n\n<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=zip>\n75001\n"
            "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=weather>\n<parameter=city>\nRome\n"
            "</parameter>\n</function>\n</tool_call>")
    d = _every_split(text, in_reasoning=True, tools=WEATHER)
    assert d.reasoning == "I will check." and d.content == ""
    assert [c.name for c in d.tool_calls] == ["weather", "weather"]
    assert json.loads(d.tool_calls[0].arguments) == {"city": "Paris", "days": 3, "metric": True, "zip": "75001"}
    assert json.loads(d.tool_calls[1].arguments) == {"city": "Rome"}


def test_with_max_calls_the_answer_ends_at_that_call():
    text = ("<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
            "and more\n<tool_call>\n<function=weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>")
    d = _every_split(text, in_reasoning=False, tools=WEATHER, max_calls=1)
    assert [json.loads(c.arguments) for c in d.tool_calls] == [{"city": "Paris"}] and d.content == ""
    parser = OutputParser(False, WEATHER, max_calls=1)
    parser.feed(text[:20])
    assert not parser.done
    parser.feed(text[20:])
    assert parser.done and not parser.feed("<tool_call>") and not parser.finish()


def test_qwen3_json_tool_calls_and_calls_without_tools_stay_text():
    text = 'Sure.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    d = _every_split(text, in_reasoning=False, tools=WEATHER)
    assert d.content == "Sure.\n" and json.loads(d.tool_calls[0].arguments) == {"city": "Oslo"}
    assert _every_split(text, in_reasoning=False).content == text  # no tools offered: not a call


def test_an_unclosed_tool_call_is_given_back_as_content():
    d = _every_split("<tool_call>\n<function=weather>", in_reasoning=False, tools=WEATHER)
    assert d.content == "<tool_call>\n<function=weather>" and not d.tool_calls


@pytest.mark.parametrize("value, schema, want", [("12", {"type": "number"}, 12), ("x y", {"type": "integer"}, "x y"),
                                                ('["a"]', {"type": "array"}, ["a"]), ("007", {}, "007")])
def test_parameter_types(value, schema, want):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                             "properties": {"p": schema}}}}]
    d = _run("", [f"<tool_call>\n<function=f>\n<parameter=p>\n{value}\n</parameter>\n</function>\n</tool_call>"],
             False, tools)
    assert json.loads(d.tool_calls[0].arguments) == {"p": want}
