"""Splits a streamed answer into reasoning, content and tool calls, as the text arrives.

Qwen3.5 answers ``[reasoning]</think>\\n\\ncontent`` when the prompt ends inside ``<think>``
(thinking on), and writes tool calls as
``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nV\\n</parameter>\\n</function>\\n</tool_call>``
(its chat template's format; Qwen3's JSON form ``<tool_call>{"name": .., "arguments": ..}
</tool_call>`` is read too). Parameter values are typed by the tool's JSON schema. Text that
could be the start of a tag is held back until it is decided, so a tag split across chunks
(or bytes) never leaks into ``content``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as the OpenAI API carries it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


def _held_back(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper start of one of ``tags``."""
    for n in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        if any(tag.startswith(text[-n:]) for tag in tags):
            return n
    return 0


class OutputParser:
    """``feed(text) -> Delta`` per chunk, ``finish() -> Delta`` at the end of the answer.
    With ``max_calls`` (parallel_tool_calls false: 1) the answer ends at that many tool calls:
    ``done`` turns true and the rest of the text is dropped, so the caller can stop generating."""

    def __init__(self, in_reasoning: bool, tools: list[dict] | None = None, max_calls: int | None = None):
        self.mode = "reasoning" if in_reasoning else "content"
        self.tools = {t["function"]["name"]: t["function"] for t in (tools or []) if t.get("type") == "function"}
        self.buffer = ""
        self.calls = 0
        self.max_calls = max_calls
        self.done = False
        self._content_started = False

    def _tags(self) -> tuple[str, ...]:
        if self.mode == "reasoning":
            return (_THINK_CLOSE,)
        if self.mode == "tool":
            return (_CALL_CLOSE,)
        return (_THINK_OPEN, _CALL_OPEN) if self.tools else (_THINK_OPEN,)

    def feed(self, text: str, final: bool = False) -> Delta:
        out = Delta()
        if self.done:
            return out
        self.buffer += text
        while True:
            tags = self._tags()
            found = [(self.buffer.find(t), t) for t in tags if t in self.buffer]
            if not found:
                keep = 0 if final else _held_back(self.buffer, tags)
                if self.mode != "tool" or final:
                    self._emit(out, self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                return out
            at, tag = min(found)
            before, self.buffer = self.buffer[:at], self.buffer[at + len(tag):]
            if self.mode == "tool":
                out.tool_calls.append(self._parse_call(before))
                self.mode = "content"
                if self.max_calls is not None and self.calls >= self.max_calls:
                    self.done, self.buffer = True, ""
                    return out
            else:
                self._emit(out, before)
                self.mode = {_THINK_CLOSE: "content", _THINK_OPEN: "reasoning", _CALL_OPEN: "tool"}[tag]
                if tag == _THINK_CLOSE:
                    self.buffer = self.buffer.lstrip("\n")

    def finish(self) -> Delta:
        """The rest of the answer; an unclosed tool call is given back as content."""
        if self.mode != "tool" or self.done:
            return self.feed("", final=True)
        out, self.mode = Delta(), "content"
        self._emit(out, _CALL_OPEN + self.buffer)
        self.buffer = ""
        return out

    def _emit(self, out: Delta, text: str) -> None:
        if self.mode == "reasoning":
            out.reasoning += text
        elif text.strip() or (self._content_started and not self.calls):
            # Whitespace around tool calls is the template's layout, not an answer.
            if not self._content_started:
                text = text.lstrip("\n")
            self._content_started = True
            out.content += text

    def _parse_call(self, block: str) -> ToolCall:
        self.calls += 1
        block = block.strip()
        if block.startswith("{"):
            try:
                call = json.loads(block)
                return ToolCall(str(call["name"]), json.dumps(call.get("arguments", {}), ensure_ascii=False))
            except (ValueError, KeyError, TypeError):
                return ToolCall("", json.dumps({"_unparsed": block}))
        name, args = "", {}
        if block.startswith("<function="):
            end = block.find(">")
            name = block[len("<function="): end].strip()
            schema = self.tools.get(name, {}).get("parameters", {}).get("properties", {})
            rest = block[end + 1:]
            while (start := rest.find("<parameter=")) >= 0:
                close = rest.find(">", start)
                stop = rest.find("</parameter>", close)
                if close < 0 or stop < 0:
                    break
                key = rest[start + len("<parameter="): close].strip()
                value = rest[close + 1: stop]
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                args[key] = _typed(value, schema.get(key, {}))
                rest = rest[stop + len("</parameter>"):]
        return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _typed(value: str, schema: dict) -> Any:
    """A parameter value as its schema's type says (strings stay as written)."""
    kind = schema.get("type", "string")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
