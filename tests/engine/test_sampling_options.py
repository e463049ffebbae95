"""min-p and the penalties through Model.generate on the demo checkpoint: penalised greedy
follows numpy penalties over model.score's logits step by step, min_p = 1 is greedy,
seeded draws reproduce, neutral values dispatch exactly the kernels they did before, and
bad values raise errors naming the argument. logprobs: each chunk's logprob and top ids
equal numpy's log-softmax of model.score's raw logits at that position (greedy, sampled
and penalised), at the cost of one dispatch per step only when asked for."""

from __future__ import annotations

import numpy as np
import pytest

import metalqwen

PROMPT = [11, 12, 13, 11, 12, 13, 11, 12]  # a repetitive prompt: the repetition penalty has work to do


@pytest.fixture(scope="module")
def model(demo, device):
    return metalqwen.load(demo, device=device, max_context=128, progress=False)


def penalised(logits, context, generated, repetition, presence, frequency):
    """vLLM's penalties in float32: repetition over the whole context, then frequency and
    presence over the generated tokens."""
    out = logits.astype(np.float32).copy()
    seen = np.unique(context)
    out[seen] = np.where(out[seen] > 0, out[seen] / np.float32(repetition), out[seen] * np.float32(repetition))
    counts = np.bincount(np.asarray(generated, np.int64), minlength=out.size).astype(np.float32)
    out -= np.float32(frequency) * counts
    out -= np.where(counts > 0, np.float32(presence), np.float32(0))
    return out


@pytest.mark.parametrize("repetition,presence,frequency", [(1.8, 0.0, 0.0), (1.0, 1.5, 0.0), (1.0, 0.0, 0.7),
                                                           (1.3, 0.5, 0.5)])
def test_penalised_greedy_follows_the_penalised_logits(model, repetition, presence, frequency):
    n = 6
    model.reset()
    got = model.generate(PROMPT, max_tokens=n, repetition_penalty=repetition, presence_penalty=presence,
                         frequency_penalty=frequency).tokens
    want = []
    for _ in range(n):
        row = model.score(PROMPT + want)[-1]
        chosen = penalised(row, PROMPT + want, want, repetition, presence, frequency)
        top2 = np.sort(chosen)[-2:]
        assert top2[1] - top2[0] > 1e-3, "a near tie: pick another prompt"
        want.append(int(np.argmax(chosen)))
    assert got == want


def test_a_large_penalty_stops_the_repeats_greedy_makes(model):
    model.reset()
    greedy = model.generate(PROMPT, max_tokens=16).tokens
    assert len(set(greedy)) < len(greedy), "greedy should repeat a token on this prompt"
    model.reset()
    fresh = model.generate(PROMPT, max_tokens=16, presence_penalty=2.0, frequency_penalty=2.0,
                           repetition_penalty=50.0).tokens
    assert fresh != greedy
    assert not set(fresh) & set(PROMPT) and len(set(fresh)) == len(fresh)


def test_min_p_1_is_greedy_and_seeded_draws_reproduce(model):
    model.reset()
    greedy = model.generate(PROMPT, max_tokens=8).tokens
    for seed in (1, 2):
        model.reset()
        assert model.generate(PROMPT, max_tokens=8, temperature=1.5, min_p=1.0, seed=seed).tokens == greedy
    options = dict(max_tokens=12, temperature=1.2, top_p=0.95, min_p=0.05, presence_penalty=0.5,
                   repetition_penalty=1.2)
    runs = []
    for seed in (7, 7, 8):
        model.reset()
        runs.append(model.generate(PROMPT, seed=seed, **options).tokens)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_neutral_options_dispatch_the_same_kernels(model):
    def decode_dispatches(**options):
        model.reset()
        model.generate(PROMPT, max_tokens=3, **options)
        return model.counters()["dispatches_last_step"]

    for sampled in ({}, {"temperature": 0.8, "seed": 3}):
        plain = decode_dispatches(**sampled)
        neutral = decode_dispatches(min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                                    **sampled)
        assert neutral == plain
        assert decode_dispatches(min_p=0.2, **sampled) == plain  # min-p lives in the sampler itself
        # A penalty adds its two kernels (count, apply) to the step.
        assert decode_dispatches(presence_penalty=0.5, **sampled) == plain + 2


def log_softmax(rows):
    rows = rows.astype(np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("options", [{}, {"temperature": 1.3, "top_p": 0.9, "seed": 4},
                                     {"repetition_penalty": 1.5, "presence_penalty": 1.0}])
@pytest.mark.parametrize("top", [0, 5, 20])
def test_logprobs_are_the_raw_log_softmax_at_each_position(model, options, top):
    model.reset()
    chunks = [c for c in model.stream(PROMPT, max_tokens=7, logprobs=top, **options) if c.token is not None]
    tokens = [c.token for c in chunks]
    # Row i of score(prompt + tokens) predicts tokens[i]: raw logits, before penalties and temperature.
    want = log_softmax(model.score(PROMPT + tokens)[len(PROMPT) - 1:-1])
    for i, c in enumerate(chunks):
        assert abs(c.logprob - want[i, c.token]) <= 1e-4, (i, c.logprob, want[i, c.token])
        ids = [t for t, _ in c.top_logprobs]
        assert ids == np.argsort(-want[i], kind="stable")[:top].tolist()
        np.testing.assert_allclose([lp for _, lp in c.top_logprobs], want[i, ids], rtol=0, atol=1e-4)
    assert all(c.logprob is None and c.top_logprobs == [] for c in model.stream(PROMPT, max_tokens=3))


def test_logprobs_cost_one_dispatch_per_step_when_asked(model):
    def decode_dispatches(**options):
        model.reset()
        model.generate(PROMPT, max_tokens=3, **options)
        return model.counters()["dispatches_last_step"]

    plain = decode_dispatches()
    assert decode_dispatches(logprobs=None) == plain
    assert decode_dispatches(logprobs=0) == decode_dispatches(logprobs=20) == plain + 1


@pytest.mark.parametrize("name,value,error", [
    ("min_p", 1.5, ValueError), ("min_p", -0.1, ValueError), ("min_p", "0.1", TypeError),
    ("presence_penalty", 2.5, ValueError), ("frequency_penalty", -3, ValueError),
    ("frequency_penalty", None, TypeError), ("repetition_penalty", 0, ValueError),
    ("repetition_penalty", True, TypeError), ("logprobs", 21, ValueError), ("logprobs", -1, ValueError),
    ("logprobs", True, TypeError),
])
def test_bad_values_name_the_argument(model, name, value, error):
    with pytest.raises(error, match=name):
        model.stream(PROMPT, max_tokens=2, **{name: value})
