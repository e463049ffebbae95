"""metalqwen.constraints: grammar-constrained decoding with the demo checkpoint's tokenizer
(byte-level BPE shaped like Qwen's, <tool_call> and </think> as added tokens), driven on the
CPU by random numpy logits masked with Constraint.mask(), as the GPU's token_mask applies it.

- the mask is exact: bit t set <=> the grammar accepts token t next (every token checked);
- every output of greedy and sampled decoding parses and validates against its JSON schema
  (jsonschema), over nested objects, enums, arrays with min/max items, escaped and non-ASCII
  strings, numbers with bounds, optional and required fields, any JSON object; a regex, a
  Lark grammar; after free reasoning and </think> when the prompt ends inside <think>;
- the forced tool-call grammar's output is read by OutputParser into the right ToolCall,
  its arguments valid against the tool's parameters (also after thinking, and a named tool);
- a refused token raises and leaves the state usable; drafts are cut at the first refused
  token and their per-row masks equal the masks after committing them one by one.

Decoding: a random phase (the masked argmax or a softmax draw of random logits), then a
closing phase that, to end in bounded time, takes the first of a few closing token
sequences (EOS, '\\n</parameter>\\n', '"', '}', ...) the grammar accepts whole, else a
random allowed token: every token still comes from the grammar, which decides the output.
"""

import json
import re

import jsonschema
import numpy as np
import pytest
from metalqwen.constraints import ConstraintError, Grammars, fill_masks
from metalqwen.server.output_parser import OutputParser
from metalqwen.tokenizer import Tokenizer

VOCAB = 1024  # the demo model's vocabulary (its logits' row length; the tokenizer has fewer ids)
NO_WS = {"whitespace_flexible": False}


@pytest.fixture(scope="module")
def tok(demo):
    return Tokenizer.from_folder(demo)


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars(tok, VOCAB)


def allowed(mask: np.ndarray) -> np.ndarray:
    """bool [VOCAB] from a uint32 mask (bit t % 32 of word t // 32), as token_mask reads it."""
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB].astype(bool)


def masked_choice(logits, mask, rng, temperature):
    """Disallowed -> -inf, then argmax (temperature 0) or a softmax draw."""
    logits = np.where(allowed(mask), logits, -np.inf)
    if temperature == 0:
        return int(np.argmax(logits))
    p = np.exp((logits - logits.max()) / temperature)
    return int(rng.choice(VOCAB, p=p / p.sum()))


def closers(tok, grammars):
    """Token sequences that tend to end the output, tried in order in the closing phase."""
    texts = ["\n</parameter>\n", "</function>\n", '"', "}", "]", ",", ":", "0", "\n"]
    seqs = [[e] for e in grammars.eos_token_ids]
    seqs += [[tok.token_to_id("</think>"), *tok.encode("\n\n")], [tok.token_to_id("</tool_call>")]]
    return seqs + [tok.encode(t) for t in texts]


def decode(constraint, tok, grammars, rng, *, temperature=0.0, random_steps=40, max_steps=3000):
    """Generated ids (EOS excluded) of a constrained decode; the constraint ends finished or accepting at EOS."""
    ids = []
    closing = closers(tok, grammars)
    for step in range(max_steps):
        mask = constraint.mask()
        assert allowed(mask).any(), "the grammar allows no token"
        if step >= random_steps:
            seq = next((s for s in closing if constraint.accepted_prefix(s) == len(s)), None)
            if seq is not None:
                if seq[0] in grammars.eos_token_ids:
                    assert allowed(mask)[seq[0]]
                    return ids
                for t in seq:
                    assert allowed(constraint.mask())[t]
                    constraint.advance(t)
                ids += seq
                continue
        t = masked_choice(rng.standard_normal(VOCAB) * 3, mask, rng, temperature)
        if t in grammars.eos_token_ids:
            assert constraint.accepting
            return ids
        constraint.advance(t)
        ids.append(t)
    raise AssertionError(f"no EOS in {max_steps} steps: {tok.decode(ids)[:300]!r}")


# ---------------------------------------------------------------------------- JSON schemas

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {
        "type": "object",
        "properties": {
            "user": {"type": "object",
                     "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                             "minItems": 1, "maxItems": 3}},
                     "required": ["id", "tags"], "additionalProperties": False},
            "score": {"type": "number", "minimum": -5, "maximum": 5},
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"], "additionalProperties": False,
    },
    "enums": {"type": "object",
              "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                             "level": {"enum": [1, 2, 3, None]},
                             "mode": {"type": "string", "enum": ['a"b', "ü\\n", "日本"]}},
              "required": ["unit", "level", "mode"], "additionalProperties": False},
    "array_bounds": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "array_of_objects": {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": {"type": "object", "properties": {"k": {"type": "string", "minLength": 2,
                                                                          "maxLength": 5}},
                                   "required": ["k"], "additionalProperties": False}},
    "strings": {"type": "object",
                "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 12},
                               "t": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"}},
                "required": ["s", "t"], "additionalProperties": False},
    "optional": {"type": "object",
                 "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4},
                                "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
                 "required": ["b"], "additionalProperties": False},
    "any_of": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "object", "properties": {"x": {"type": "null"}},
                                                              "required": ["x"], "additionalProperties": False}]},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_validates_against_the_schema(grammars, tok, name, temperature):
    schema = SCHEMAS[name]
    for trial in range(3):
        rng = np.random.default_rng([len(name), trial, int(temperature * 10)])
        c = grammars.json_schema(schema, NO_WS)
        text = tok.decode(decode(c, tok, grammars, rng, temperature=temperature, random_steps=int(rng.integers(5, 60))))
        jsonschema.validate(json.loads(text), schema)


def test_flexible_whitespace_and_unicode_escapes_still_validate(grammars, tok):
    # llguidance's default JSON options: any JSON whitespace, \\uXXXX escapes in strings.
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"], "additionalProperties": False}
    for trial in range(4):
        c = grammars.json_schema(schema)
        text = tok.decode(decode(c, tok, grammars, np.random.default_rng([7, trial]), random_steps=30))
        jsonschema.validate(json.loads(text), schema)


def test_json_object_is_any_object(grammars, tok):
    for trial in range(4):
        c = grammars.json_object()
        text = tok.decode(decode(c, tok, grammars, np.random.default_rng([9, trial]), temperature=1.0,
                                 random_steps=20))
        assert isinstance(json.loads(text), dict)


def test_after_thinking_the_answer_validates(grammars, tok):
    # The prompt ends inside <think>: reasoning, </think> (its own token), then the constrained answer.
    schema = SCHEMAS["enums"]
    for trial in range(3):
        c = grammars.json_schema(schema, NO_WS, thinking=True)
        ids = decode(c, tok, grammars, np.random.default_rng([5, trial]), random_steps=25)
        assert ids.count(tok.token_to_id("</think>")) == 1
        parser = OutputParser(in_reasoning=True)
        deltas = [parser.feed(tok.decode(ids)), parser.finish()]
        jsonschema.validate(json.loads("".join(d.content for d in deltas)), schema)
    text = tok.decode(decode(grammars.regex("[0-9]{1,3}/[a-z]", thinking=True), tok, grammars,
                             np.random.default_rng(6), random_steps=10))
    assert re.fullmatch(r"(?s).*</think>\n\n[0-9]{1,3}/[a-z]", text), text


def test_response_format(grammars, tok):
    assert grammars.response_format({"type": "text"}) is None
    schema = SCHEMAS["flat"]
    c = grammars.response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(tok.decode(decode(c, tok, grammars, np.random.default_rng(8)))), schema)
    c = grammars.response_format({"type": "json_object"})
    assert isinstance(json.loads(tok.decode(decode(c, tok, grammars, np.random.default_rng(8), random_steps=5))), dict)
    with pytest.raises(ConstraintError, match="response_format.type 'yaml'"):
        grammars.response_format({"type": "yaml"})
    with pytest.raises(ConstraintError, match="response_format.json_schema"):
        grammars.response_format({"type": "json_schema", "json_schema": {"schema": [1]}})


def test_regex_and_lark(grammars, tok):
    pattern = r"(yes|no): [0-9]{1,3}"
    for trial in range(3):
        text = tok.decode(decode(grammars.regex(pattern), tok, grammars, np.random.default_rng([3, trial])))
        assert re.fullmatch(pattern, text), text
    lark = 'start: "(" item ("," item)* ")"\nitem: /[a-z]{1,4}/ | start'
    text = tok.decode(decode(grammars.lark(lark), tok, grammars, np.random.default_rng(4), random_steps=15))
    assert re.fullmatch(r"[(),a-z]+", text) and text.count("(") == text.count(")"), text
    gbnf = 'root ::= "id-" [0-9]{1,4} ("," "id-" [0-9]{1,4})?'
    for trial in range(3):
        text = tok.decode(decode(grammars.gbnf(gbnf), tok, grammars, np.random.default_rng([10, trial]), random_steps=4))
        assert re.fullmatch(r"id-[0-9]{1,4}(,id-[0-9]{1,4})?", text), text


def test_mask_is_exact(grammars, tok):
    # Every id, in several states: bit set <=> the grammar takes the token (ids past the tokenizer never).
    c = grammars.json_schema(SCHEMAS["nested"], NO_WS)
    for prefix in ["", '{"user":{"id":1', '{"user":{"id":12,"tags":["ab"', '{"user":{"id":3,"tags":["x"]},"ok":true']:
        ids = tok.encode(prefix)
        for t in ids:
            c.advance(t)
        bits = allowed(c.mask())
        assert not bits[tok.vocab_size:].any()
        for t in range(tok.vocab_size):
            assert bits[t] == (c.accepted_prefix([t]) == 1), (prefix, t, tok.decode([t]))
        c.rollback(len(ids))
    eos = grammars.eos_token_ids[0]
    done = grammars.json_schema({"type": "integer", "maximum": 9})
    done.advance(tok.encode("7")[0])
    assert done.finished and allowed(done.mask()).nonzero()[0].tolist() == [eos]


def test_a_refused_token_raises_and_the_state_stays_usable(grammars, tok):
    c = grammars.json_schema(SCHEMAS["flat"], NO_WS)
    c.advance(tok.encode("{")[0])
    with pytest.raises(ConstraintError, match=r"token \d+ \('x'\) is not allowed"):
        c.advance(tok.encode("x")[0])
    c.advance(tok.encode('"')[0])  # still usable where it was
    with pytest.raises(ConstraintError, match="json_schema"):
        grammars.json_schema({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
                              "required": ["a"]})
    with pytest.raises(ConstraintError, match="lark"):
        grammars.lark("start: undefined_rule")


def test_drafts_are_cut_at_the_first_refused_token(grammars, tok):
    c = grammars.json_schema(SCHEMAS["flat"], NO_WS)
    good = tok.encode('{"name":"Al","age":4')
    bad = tok.encode("x")
    drafts = good + bad + tok.encode("}")
    assert c.accepted_prefix(drafts) == len(good)
    a, masks = c.draft_masks(drafts)
    assert a == len(good) and masks.shape == (a + 1, c.mask_words)
    # Nothing was committed, and row k is the mask after drafts[:k].
    assert c.accepted_prefix(drafts) == len(good)
    for k in range(a + 1):
        np.testing.assert_array_equal(masks[k], c.mask(), err_msg=f"verify row {k}")
        assert allowed(masks[k])[drafts[k]] == (k < a)
        if k < a:
            c.advance(drafts[k])
    assert c.accepted_prefix([]) == 0


# ---------------------------------------------------------------------------- forced tool calls

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "engine": {"type": "string", "enum": ["web", "news <b>\\"]},
            "filters": {"type": "object", "properties": {"year": {"type": "integer"},
                                                         "langs": {"type": "array", "items": {"enum": ["en", "fr"]},
                                                                   "maxItems": 2}},
                        "required": ["year"], "additionalProperties": False},
            "exact": {"type": "boolean"}},
            "required": ["query", "engine", "filters"]}}},
]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def parsed(tok, ids, thinking):
    parser = OutputParser(in_reasoning=thinking, tools=TOOLS)
    text = tok.decode(ids)
    deltas = [parser.feed(text), parser.finish()]
    return (text, "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas),
            [call for d in deltas for call in d.tool_calls])


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_tool_choice_gives_valid_calls(grammars, tok, thinking, temperature):
    names = set()
    for trial in range(6):
        rng = np.random.default_rng([11, trial, thinking, int(temperature)])
        c = grammars.tool_call(TOOLS, thinking=thinking)
        ids = decode(c, tok, grammars, rng, temperature=temperature, random_steps=int(rng.integers(5, 50)))
        text, _, content, calls = parsed(tok, ids, thinking)
        assert calls and content.strip() == "", text
        assert ids[0] == tok.token_to_id("<tool_call>") or thinking
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMA_OF[call.name])
            names.add(call.name)
    if not thinking:  # (with thinking the random phase mostly writes the reasoning)
        assert names == set(SCHEMA_OF)  # both tools were chosen at some point


def test_named_tool_choice_gives_one_call_of_that_tool(grammars, tok):
    for trial in range(4):
        c = grammars.tool_call(TOOLS, name="search")
        ids = decode(c, tok, grammars, np.random.default_rng([12, trial]), random_steps=30)
        _, _, content, calls = parsed(tok, ids, False)
        assert [call.name for call in calls] == ["search"] and not content.strip()
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMA_OF["search"])
        assert c.finished  # one call, then only EOS
    with pytest.raises(ConstraintError, match="'nope'"):
        grammars.tool_call(TOOLS, name="nope")


def test_tool_grammar_refuses_text_before_the_call_and_unknown_functions(grammars, tok):
    c = grammars.tool_call(TOOLS)
    assert c.accepted_prefix(tok.encode("Sure")) == 0
    head = [tok.token_to_id("<tool_call>"), *tok.encode("\n<function=")]
    assert c.accepted_prefix(head + tok.encode("rm_rf>")) == len(head)
    assert c.accepted_prefix(head + tok.encode("search>")) == len(head + tok.encode("search>"))
    t = grammars.tool_call(TOOLS, thinking=True)
    assert t.accepted_prefix(tok.encode("I will call it.") + [tok.token_to_id("</think>")] + tok.encode("\n\n")) > 3


def test_fill_masks_writes_each_sequences_row(grammars, tok):
    # A shared step: three constrained sequences in rows 0, 2, 3 of the step's mask buffer; row 1 free.
    cs = [grammars.json_schema(SCHEMAS["flat"], NO_WS), grammars.regex("[a-z]{2}"), grammars.tool_call(TOOLS)]
    for t in tok.encode('{"name":"B'):
        cs[0].advance(t)
    out = np.full((4, cs[0].mask_words), 0xFFFFFFFF, np.uint32)
    fill_masks([(cs[0], 0), (cs[1], 2), (cs[2], 3)], out)
    for c, r in [(cs[0], 0), (cs[1], 2), (cs[2], 3)]:
        np.testing.assert_array_equal(out[r], c.mask(), err_msg=f"row {r}")
    assert (out[1] == 0xFFFFFFFF).all()
    with pytest.raises(ConstraintError, match="mask row 4 of 4"):
        fill_masks([(cs[1], 4)], out)
