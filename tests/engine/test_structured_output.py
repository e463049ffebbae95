"""Structured output and logit_bias through Model.generate on the demo checkpoint (random
weights), the masks and biases applied on the GPU:

- logit_bias: greedy tokens are numpy's argmax of model.score's logits plus the bias at every
  step (prefill's choice and the decode steps); -100 on the greedy token moves it, +100 forces one;
- a grammar: every greedy token is numpy's argmax over the tokens llguidance allows there
  (the mask reaches the choice, and changes it), also under a logit_bias;
- outputs parse and validate (jsonschema) for nested objects, enums, arrays and escaped
  strings, greedy and sampled; Lark and GBNF grammars; json_object;
- constrained sequences in shared steps (beside plain, biased and penalised ones) get what
  they get alone; speculation pauses under a grammar;
- a constrained step is one step of two command buffers and one CPU wait, and plain decoding
  dispatches what it did; bad arguments raise errors naming the field.

The schemas bound every string, number and array and keep JSON compact (llguidance's
"x-guidance" whitespace option): random weights would otherwise write whitespace forever."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

import metalqwen
from metalqwen._core import Sampling
from metalqwen.constraints import ConstraintError

PROMPT = [31, 7, 200, 45, 9, 300, 12]
COMPACT = {"x-guidance": {"whitespace_flexible": False}}

NESTED = {"type": "object", "properties": {
    "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                              "role": {"enum": ["admin", "guest"]}},
             "required": ["id", "role"], "additionalProperties": False},
    "ok": {"type": "boolean"}}, "required": ["user", "ok"], "additionalProperties": False, **COMPACT}
ESCAPES = {"type": "array", "items": {"enum": ['say "hi"', "a\\b", "line\nbreak", "tab\t"]}, "minItems": 1,
           "maxItems": 3, **COMPACT}
STRINGS = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5},
                                            "n": {"type": "number", "minimum": -1, "maximum": 1}},
           "required": ["s"], "additionalProperties": False, **COMPACT}


@pytest.fixture(scope="module")
def model(demo, device):
    return metalqwen.load(demo, device=device, max_context=256, progress=False, max_sequences=3,
                          speculative="lookup")


def allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    """bool [vocab]: bit t % 32 of word t // 32, as token_mask reads it."""
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab].astype(bool)


def rows_after(model, prompt, tokens):
    """Logits row k: the model's prediction of tokens[k] (model.score over prompt + tokens)."""
    return model.score(prompt + tokens)[len(prompt) - 1:]


def assert_clear(row):
    top2 = np.sort(row[np.isfinite(row)])[-2:]
    assert top2.size < 2 or top2[1] - top2[0] > 1e-3, "a near tie: pick another prompt"


def test_logit_bias_greedy_follows_numpy_over_the_scores(model):
    greedy = 519  # the unbiased greedy token after PROMPT (checked below)
    rng = np.random.default_rng(1)
    bias = {int(t): float(b) for t, b in zip(rng.choice(model.config.vocab_size, 40, replace=False),
                                             rng.uniform(-4, 4, 40))}
    bias[greedy] = -100.0
    model.reset()
    chunks = [c for c in model.stream(PROMPT, max_tokens=6, logit_bias=bias, logprobs=0) if c.token is not None]
    got = [c.token for c in chunks]
    table = np.zeros(model.config.vocab_size, np.float32)
    table[list(bias)] = list(bias.values())
    rows = rows_after(model, PROMPT, got[:-1])
    assert int(np.argmax(rows[0])) == greedy != got[0]
    def log_softmax(row):
        row = row.astype(np.float64)
        return row - row.max() - np.log(np.sum(np.exp(row - row.max())))

    for k, row in enumerate(rows):
        assert_clear(row + table)
        assert got[k] == int(np.argmax(row + table)), k
        # The logprobs are the model's, the bias not included (as vLLM reports them). Decode rows
        # (matvec) and score's (GEMM) differ by ~1e-4; the bias moves the logprobs by far more.
        raw, biased = log_softmax(row)[got[k]], log_softmax(row + table)[got[k]]
        assert abs(chunks[k].logprob - raw) < 1e-3 < abs(biased - raw), k
    model.reset()
    model.generate(PROMPT, max_tokens=3, logit_bias=bias)
    assert model.last_stats.verify_steps == 0  # logit_bias turns speculation off (lookup is on)
    model.reset()
    assert model.generate(PROMPT, max_tokens=2, logit_bias={"77": 100}).tokens == [77] * 2  # OpenAI's string keys
    # An answer ended by eos: its tokens hold the eos, alone as in a batch.
    eos = model.eos_token_ids[0]
    model.reset()
    alone = model.generate(PROMPT, max_tokens=4, logit_bias={eos: 100})
    assert alone.tokens == [eos] and alone.finish_reason == "stop" and alone.text == ""
    assert model.generate_batch([PROMPT], max_tokens=4, logit_bias={eos: 100})[0].tokens == alone.tokens


def test_the_grammar_mask_decides_each_greedy_token(model):
    grammar = 'start: /[a-z]{2,6}/ ("-" | "+") /[0-9]{1,3}/'
    bias = {model.tokenizer.encode("+")[0]: 2.5}  # the mask and a bias together, as the GPU applies them
    model.reset()
    got = model.generate(PROMPT, max_tokens=20, grammar=grammar, logit_bias=bias)
    tokens = model.last_tokens  # the eos token included
    assert got.finish_reason == "stop" and tokens[-1] in model.eos_token_ids
    assert got.text[-1].isdigit() and ("-" in got.text or "+" in got.text)
    reference = model.grammars.grammar(grammar)
    table = np.zeros(model.config.vocab_size, np.float32)
    table[list(bias)] = list(bias.values())
    changed = 0
    for k, row in enumerate(rows_after(model, PROMPT, tokens[:-1])):
        masked = np.where(allowed(reference.mask(), row.size), row, -np.inf) + table
        assert_clear(masked)
        assert tokens[k] == int(np.argmax(masked)), k
        changed += int(np.argmax(row + table)) != tokens[k]
        reference.advance(tokens[k])
    assert changed > 0, "the mask never changed a choice: the test shows nothing"


@pytest.mark.parametrize("schema, sampled", [(NESTED, False), (ESCAPES, True)])
def test_json_schema_outputs_parse_and_validate(model, schema, sampled):
    options = dict(temperature=1.0, seed=5) if sampled else {}
    model.reset()
    got = model.generate("JSON please:", max_tokens=60, json_schema=schema, **options)
    assert got.finish_reason == "stop", got.text
    jsonschema.validate(json.loads(got.text), schema)


def test_lark_gbnf_and_json_object_grammars(model):
    model.reset()
    assert model.generate(PROMPT, max_tokens=8, grammar='start: "yes" | "no"').text in ("yes", "no")
    model.reset()
    text = model.generate(PROMPT, max_tokens=12, grammar='root ::= "A" [a-c]{2,4} "!"').text
    assert text[0] == "A" and text[-1] == "!" and set(text[1:-1]) <= set("abc") and 2 <= len(text) - 2 <= 4
    # json_object with flexible whitespace: "}" biased up, so the only object is closed at once.
    model.reset()
    close = model.tokenizer.encode("}")[0]
    got = model.generate(PROMPT, max_tokens=8, response_format={"type": "json_object"}, logit_bias={close: 100})
    assert got.text == "{}" and got.finish_reason == "stop"


def test_constrained_sequences_in_shared_steps_equal_each_alone(model):
    requests = [("Tell me:", dict(json_schema=ESCAPES)),
                ([5, 6, 7], dict(max_tokens=6, logit_bias={12: 5.0}, presence_penalty=0.5)),
                ("x", dict(json_schema=STRINGS, temperature=0.9, seed=2, logit_bias={40: 3.0})),
                ("y", dict(grammar="start: /[0-9]{3}/", logprobs=2))]
    alone = []
    for prompt, options in requests:
        model.reset()
        chunks = list(model.stream(prompt, **{"max_tokens": 24, **options}))
        alone.append((model.last_tokens, [(c.logprob, c.top_logprobs) for c in chunks if c.token is not None]))
    scheduler = metalqwen.batching.Scheduler(model)
    batched = [scheduler.submit(prompt, **{"max_tokens": 24, **options}) for prompt, options in requests]
    scheduler.run()
    for (tokens, logprobs), seq in zip(alone, batched):
        assert seq.generation().tokens == tokens
        assert [(c.logprob, c.top_logprobs) for c in seq.take() if c.token is not None] == logprobs
    jsonschema.validate(json.loads(batched[0].generation().text), ESCAPES)
    jsonschema.validate(json.loads(batched[2].generation().text), STRINGS)


def test_dispatches_buffers_and_waits_of_biased_and_constrained_steps(model):
    def run(**options):
        model.reset()
        before = model.counters()
        got = model.generate(PROMPT, max_tokens=4, **options)
        after = model.counters()
        return got, {k: after[k] - before[k] for k in ("steps", "command_buffers", "cpu_waits")}, \
            after["dispatches_last_step"]

    _, _, plain = run(speculative="off")
    assert run(speculative="off", logit_bias={})[2] == plain  # neutral: the same kernels
    assert run(logit_bias={3: 1.0})[2] == plain + 2  # the copy and the bias (and no drafts: lookup is on)
    got, counts, masked = run(grammar="start: /[a-z]{40}/")
    assert masked == plain + 1 and got.stats.verify_steps == 0 and len(got.tokens) == 4
    # Prefill (its buffers per 8 layers), then 3 steps of two command buffers and one CPU wait each.
    prefill_buffers = -(-model.config.num_hidden_layers // 8)
    assert counts == {"steps": 4, "command_buffers": prefill_buffers + 2 * 3, "cpu_waits": 4}


@pytest.mark.parametrize("options, field", [
    (dict(json_schema={"type": "object", "properties": 3}), "json_schema"),
    (dict(json_schema="{not json"), "json_schema"),
    (dict(grammar="start: (((", ), "grammar"),
    (dict(grammar='root ::= "a" (', ), "GBNF"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(json_schema={}, grammar='start: "a"'), "json_schema and grammar"),
])
def test_bad_grammars_raise_constraint_errors_naming_the_field(model, options, field):
    with pytest.raises(ConstraintError, match=field):
        model.generate(PROMPT, max_tokens=2, **options)


@pytest.mark.parametrize("bias, error, words", [
    ({5: 101}, ValueError, "logit_bias"), ({-1: 1}, ValueError, "logit_bias token id"),
    ({10**6: 1}, ValueError, "outside the vocabulary"), ({"x": 1}, TypeError, "logit_bias keys"),
    ({i: 1 for i in range(301)}, ValueError, "at most 300"), ([1, 2], TypeError, "mapping"),
    ({"5": 1, 5: 2}, ValueError, "twice"),
])
def test_bad_logit_bias_raises_naming_it(model, bias, error, words):
    with pytest.raises(error, match=words):
        model.generate(PROMPT, max_tokens=2, logit_bias=bias)


def test_the_engine_refuses_masks_where_it_cannot_honour_them(model):
    engine = model._engine
    model.reset()
    engine.prefill(0, PROMPT, Sampling())
    with pytest.raises(RuntimeError, match="decode steps take no token mask"):
        engine.decode_begin(0, 3, Sampling(token_mask=True))
    with pytest.raises(RuntimeError, match="drafts take no penalties, logprobs, logit_bias or token mask"):
        engine.step([(0, [5], Sampling(logit_bias=[(3, 1.0)]))])
    with pytest.raises(RuntimeError, match="verify step takes no logit_bias or token mask"):
        engine.verify(0, [5], Sampling(token_mask=True))
    with pytest.raises(RuntimeError, match="names a token id twice"):
        engine.step([(0, [], Sampling(logit_bias=[(3, 1.0), (3, 2.0)]))])
    assert engine.position(0) == len(PROMPT)  # refused before anything ran

    def fail():
        raise KeyboardInterrupt

    # An error in before_choice: the forward pass ran, so the step's slots start over.
    with pytest.raises(KeyboardInterrupt):
        engine.step([(0, [], Sampling(token_mask=True))], before_choice=fail)
    assert engine.position(0) == 0 and engine.tokens(0) == []
