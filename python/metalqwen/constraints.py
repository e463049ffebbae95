"""Grammar constraints on generation (structured output, forced tool calls), on llguidance.

``Grammars(tokenizer, vocab_size)`` compiles a request's constraint once per tokenizer;
each sequence gets its own ``Constraint``, a matcher over the model's token ids:
``mask()`` is the bitmask of the tokens allowed next (uint32 [ceil(vocab_size / 32)], bit
t % 32 of word t // 32 set = token t allowed; the layout shaders' token_mask reads),
computed on the CPU (llguidance releases the GIL, so a thread can compute it while the
GPU runs the step); ``advance(token)`` commits a chosen token. Speculative drafts are
checked without committing: ``accepted_prefix`` and ``draft_masks`` (one mask per verify
row). Tool calls are forced in Qwen3.5's XML layout, the one server/output_parser.py reads:
``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nV\\n</parameter>\\n</function>\\n</tool_call>``
(V raw text for a string parameter, else JSON per the parameter's schema).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance
import numpy as np

from .errors import MetalqwenError
from .tokenizer import Tokenizer

__all__ = ["Constraint", "ConstraintError", "Grammars", "fill_masks", "is_gbnf", "mask_words", "tool_call_lark"]


class ConstraintError(MetalqwenError, ValueError):
    """A grammar or schema llguidance cannot compile, or a token the grammar refuses."""


def is_gbnf(grammar: str) -> bool:
    """A grammar written in GBNF (a rule ``name ::= ...`` on some line) rather than Lark."""
    return re.search(r"^\s*[A-Za-z0-9_-]+\s*::=", grammar, re.MULTILINE) is not None


def mask_words(vocab_size: int) -> int:
    """32-bit words of one token mask."""
    return (vocab_size + 31) // 32


class Grammars:
    """Compiles constraints for one tokenizer and model vocabulary (the logits' row length,
    which may exceed the tokenizer's: ids past it are never allowed). ``eos_token_ids`` end
    a generation: allowed once the grammar accepts, the only tokens once it is complete."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int] | None = None):
        eos = list(eos_token_ids) if eos_token_ids else [tokenizer.eos_token_id]
        if None in eos:
            raise ConstraintError("[constraints] the tokenizer names no EOS token: pass eos_token_ids")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos
        # tokenizer.json as the tokenizers package serialises it (added tokens included).
        self._llg = llguidance.LLTokenizer(tokenizer._tok.to_str(), n_vocab=vocab_size, eos_token=eos)

    # ------------------------------------------------------------------ grammar sources

    def json_schema(self, schema: Mapping[str, Any] | str, options: Mapping[str, Any] | None = None, *,
                    thinking: bool = False) -> Constraint:
        """Output is one JSON value valid against ``schema`` (llguidance's JSON-schema subset;
        ``options``: its JsonCompileOptions, e.g. {"whitespace_flexible": False}). ``thinking``:
        the prompt ends inside <think>, so free reasoning and ``</think>\\n\\n`` come first."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ConstraintError(f"[constraints] json_schema is not JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError(f"[constraints] json_schema must be a JSON object, got {type(schema).__name__}")
        if options:  # read by llguidance from the schema itself, also inside a Lark grammar's %json
            schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **options}}
        if thinking:
            return self.lark(_after_thinking(self.tokenizer, f"%json {json.dumps(schema, ensure_ascii=False)}"))
        return self._constraint(llguidance.LLMatcher.grammar_from_json_schema(schema), "json_schema")

    def json_object(self, *, thinking: bool = False) -> Constraint:
        """OpenAI's response_format {"type": "json_object"}: any JSON object."""
        return self.json_schema({"type": "object"}, thinking=thinking)

    def response_format(self, response_format: Mapping[str, Any], *, thinking: bool = False) -> Constraint | None:
        """OpenAI's ``response_format``: None for {"type": "text"}, else the constraint of
        {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}, ...}}."""
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return self.json_object(thinking=thinking)
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
                raise ConstraintError("[constraints] response_format.json_schema must be an object with a 'schema' object")
            return self.json_schema(spec.get("schema", {}), thinking=thinking)
        raise ConstraintError(f"[constraints] response_format.type {kind!r} is not one of text, json_object, json_schema")

    def lark(self, grammar: str) -> Constraint:
        """A Lark grammar (llguidance's dialect: %json, special tokens as <[id]>, & and ~ on lexemes)."""
        return self._constraint(llguidance.LLMatcher.grammar_from_lark(grammar), "lark grammar")

    def grammar(self, text: str, *, thinking: bool = False) -> Constraint:
        """A grammar given as text: GBNF when its rules are written ``name ::= ...`` (llama.cpp's
        format; told apart as vLLM does), else Lark. ``thinking``: reasoning and ``</think>\n\n``
        come first, the grammar (nested whole, its own start rule kept) after them."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(f"[constraints] grammar must be Lark or GBNF text, got {text!r:.40}")
        if not thinking:
            return self.gbnf(text) if is_gbnf(text) else self.lark(text)
        if is_gbnf(text):
            try:
                text = llguidance.grammar_from("gbnf", text)
            except ValueError as e:
                raise ConstraintError(f"[constraints] GBNF grammar: {e}") from None
        return self.lark(_after_thinking(self.tokenizer, "%lark {\n" + text + "\n}"))

    def gbnf(self, grammar: str) -> Constraint:
        """A llama.cpp GBNF grammar (converted to Lark)."""
        try:
            return self._constraint(llguidance.grammar_from("gbnf", grammar), "GBNF grammar")
        except ValueError as e:
            raise ConstraintError(f"[constraints] GBNF grammar: {e}") from None

    def regex(self, pattern: str, *, thinking: bool = False) -> Constraint:
        """Output matches ``pattern`` as a whole (Rust regex syntax)."""
        if thinking:
            return self.lark(_after_thinking(self.tokenizer, "/" + pattern.replace("/", "\\/") + "/"))
        return self._constraint(llguidance.LLMatcher.grammar_from_regex(pattern), "regex")

    def tool_call(self, tools: Sequence[Mapping[str, Any]], *, name: str | None = None, max_calls: int | None = None,
                  thinking: bool = False) -> Constraint:
        """At least one tool call (tool_choice "required"), or one call of the tool ``name``
        (a named tool_choice); at most ``max_calls`` (parallel_tool_calls false: 1).
        ``thinking``: the prompt ends inside <think>, so reasoning and ``</think>\\n\\n`` come first."""
        return self.lark(tool_call_lark(self.tokenizer, tools, name=name, max_calls=max_calls, thinking=thinking))

    def _constraint(self, grammar: str, what: str) -> Constraint:
        error = llguidance.LLMatcher.validate_grammar(grammar, self._llg)
        if error:
            raise ConstraintError(f"[constraints] {what}: {error}")
        matcher = llguidance.LLMatcher(self._llg, grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"[constraints] {what}: {matcher.get_error()}")
        return Constraint(matcher, self.tokenizer, self.vocab_size, grammar)

    def again(self, grammar: str) -> Constraint:
        """A fresh constraint of a ``Constraint.grammar`` (another process's, e.g. a pipeline rank's)."""
        return self._constraint(grammar, "the grammar given")


class Constraint:
    """One sequence's grammar state. Not thread-safe: one step's calls at a time (the mask of
    step s+1 after ``advance`` of step s's token)."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: Tokenizer, vocab_size: int, grammar: str):
        self._m = matcher
        self.grammar = grammar  # llguidance's grammar text (Grammars.again makes it anew)
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.mask_words = mask_words(vocab_size)

    def mask(self, out: np.ndarray | None = None) -> np.ndarray:
        """The tokens allowed next: uint32 [mask_words], written into ``out`` if given (e.g. a
        row of the engine's mask buffer)."""
        if out is None:
            out = np.empty(self.mask_words, np.uint32)
        if out.dtype != np.uint32 or out.shape != (self.mask_words,) or not out.flags["C_CONTIGUOUS"]:
            raise ConstraintError(f"[constraints] mask buffer must be contiguous uint32 [{self.mask_words}], "
                                  f"got {out.dtype} {out.shape}")
        self._check()
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._check()
        return out

    def advance(self, token: int) -> None:
        """Commits ``token``; a token the grammar refuses raises and leaves the state as it was."""
        self._check()
        if self._m.validate_tokens([int(token)]) != 1:
            raise ConstraintError(f"[constraints] token {int(token)} ({self._tokenizer.decode([int(token)])!r}) "
                                  f"is not allowed by the grammar here")
        if not self._m.consume_token(int(token)):
            raise ConstraintError(f"[constraints] token {int(token)}: {self._m.get_error()}")

    def accepted_prefix(self, drafts: Sequence[int]) -> int:
        """How many leading ``drafts`` the grammar accepts from here (nothing committed)."""
        self._check()
        return self._m.validate_tokens([int(t) for t in drafts]) if len(drafts) else 0

    def draft_masks(self, drafts: Sequence[int], out: np.ndarray | None = None) -> tuple[int, np.ndarray]:
        """(a, masks): a = accepted_prefix(drafts) and masks uint32 [a + 1][mask_words], row k the
        mask after drafts[:k], for the verify rows 0..a (the drafts past a are refused: verify
        only those rows). Nothing is committed."""
        a = self.accepted_prefix(drafts)
        if out is None:
            out = np.empty((a + 1, self.mask_words), np.uint32)
        if out.shape[0] < a + 1:
            raise ConstraintError(f"[constraints] draft_masks needs {a + 1} mask rows, got {out.shape[0]}")
        for k in range(a + 1):
            if k:
                self._m.consume_token(int(drafts[k - 1]))
            self.mask(out[k])
        if a and not self._m.rollback(a):
            raise ConstraintError(f"[constraints] rollback of {a} draft tokens failed: {self._m.get_error()}")
        return a, out[: a + 1]

    def rollback(self, tokens: int) -> None:
        """Undoes the last ``tokens`` advances."""
        if tokens and not self._m.rollback(tokens):
            raise ConstraintError(f"[constraints] rollback of {tokens} tokens failed: {self._m.get_error()}")

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (free drafts: they need no model to guess)."""
        return list(self._m.compute_ff_tokens())

    @property
    def accepting(self) -> bool:
        """The output so far is complete: EOS is allowed."""
        return self._m.is_accepting()

    @property
    def finished(self) -> bool:
        """Complete and nothing may follow: EOS is the only token allowed (or was taken)."""
        return self._m.is_stopped()

    def _check(self) -> None:
        if self._m.is_error():
            raise ConstraintError(f"[constraints] {self._m.get_error()}")


_executor: llguidance.LLExecutor | None = None


def fill_masks(rows: Sequence[tuple[Constraint, int]], out: np.ndarray) -> None:
    """The next masks of several sequences at once (a shared step): constraint c's into row r
    of ``out`` (uint32 [rows][mask_words]) for each (c, r), on llguidance's thread pool with
    the GIL released; rows not named are left as they are (an unconstrained row: all ones)."""
    global _executor
    if not rows:
        return
    words = rows[0][0].mask_words
    if out.dtype != np.uint32 or out.ndim != 2 or out.shape[1] != words or not out.flags["C_CONTIGUOUS"]:
        raise ConstraintError(f"[constraints] masks buffer must be contiguous uint32 [rows][{words}], "
                              f"got {out.dtype} {out.shape}")
    for c, r in rows:
        if c.mask_words != words or not 0 <= r < out.shape[0]:
            raise ConstraintError(f"[constraints] mask row {r} of {out.shape[0]} for a {c.mask_words}-word mask")
        c._check()
    if _executor is None:
        _executor = llguidance.LLExecutor()
    _executor.unsafe_compute_mask_ptr([(c._m, r) for c, r in rows], out.ctypes.data, words * 4, out.shape[0])
    for c, _ in rows:
        c._check()


# ---------------------------------------------------------------------------- tool calls

# A string parameter's raw text and its closing tag as one lexeme, ending at the first
# "\n</parameter>" (a lexeme ending where the next one starts would be ambiguous).
_STRING_VALUE = r"STRING_VALUE: /(?s:.*)\n<\/parameter>/ & ~/(?s:.*)\n<\/parameter>(?s:.+)/"


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _tag(tokenizer: Tokenizer, text: str) -> str:
    """A tag as the model writes it: its own token (<[id]>) when the tokenizer has one."""
    ids = tokenizer.encode(text)
    return f"<[{ids[0]}]>" if len(ids) == 1 and tokenizer.decode(ids) == text else _literal(text)


def _is_string(schema: Mapping[str, Any]) -> bool:
    # As output_parser._typed reads values back: no type or a type including "string" is raw text.
    kind = schema.get("type", "string")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def tool_call_lark(tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], *, name: str | None = None,
                   max_calls: int | None = None, thinking: bool = False) -> str:
    """The Lark grammar of Grammars.tool_call. Parameters come in their schema's order, the
    required ones always, the others optionally; string enums are forced to their values."""
    functions = [t["function"] for t in tools if t.get("type") == "function"]
    if name is not None:
        functions = [f for f in functions if f.get("name") == name]
        if not functions:
            raise ConstraintError(f"[constraints] tool_choice names '{name}', which is not among the tools")
        max_calls = 1
    if not functions:
        raise ConstraintError("[constraints] tool_choice needs at least one function tool")
    if max_calls is not None and max_calls < 1:
        raise ConstraintError(f"[constraints] max_calls must be >= 1, got {max_calls}")
    call_open, call_close = _tag(tokenizer, "<tool_call>"), _tag(tokenizer, "</tool_call>")
    rules = []
    calls = []
    for i, fn in enumerate(functions):
        params = fn.get("parameters") or {}
        required = set(params.get("required", []))
        parts = []
        for j, (pname, pschema) in enumerate((params.get("properties") or {}).items()):
            rule = f"p{i}_{j}"
            head = _literal(f"<parameter={pname}>\n")
            if _is_string(pschema) and pschema.get("enum") and all(isinstance(v, str) for v in pschema["enum"]):
                values = " | ".join(_literal(v) for v in pschema["enum"])
                rules.append(f'{rule}: {head} ({values}) "\\n</parameter>\\n"')
            elif _is_string(pschema):
                rules.append(f'{rule}: {head} STRING_VALUE "\\n"')
            else:
                rules.append(f'{rule}: {head} v{i}_{j} "\\n</parameter>\\n"')
                rules.append(f"v{i}_{j}: %json {json.dumps(pschema, ensure_ascii=False)}")
            parts.append(rule if pname in required else f"{rule}?")
        head = _literal(f"\n<function={fn['name']}>\n")
        rules.append(f'call{i}: {call_open} {head} {" ".join(parts)} "</function>\\n" {call_close}')
        calls.append(f"call{i}")
    rules.append("call: " + " | ".join(calls))
    if max_calls is None:
        rules.append('calls: call ("\\n"? call)*')
    else:
        rules.append("calls: call" + ' ("\\n"? call)?' * (max_calls - 1))
    return "\n".join([_after_thinking(tokenizer, "calls") if thinking else "start: calls", *rules, _STRING_VALUE])


def _after_thinking(tokenizer: Tokenizer, body: str) -> str:
    """Lark: free reasoning, ``</think>\\n\\n`` (Qwen's answer after thinking), then ``body``."""
    return (f'start: THINKING {_tag(tokenizer, "</think>")} "\\n\\n" answer\nanswer: {body}\n'
            "THINKING: /(?s:.*)/")
