"""Several sequences at once (load(max_sequences=N), batching.Scheduler, Engine.step): every
sequence decoded in shared steps gets exactly what it gets alone, whatever runs beside it."""

from __future__ import annotations

import numpy as np
import pytest

import metalqwen
from metalqwen._core import Sampling
from metalqwen.batching import Scheduler

# Four requests that differ in prompt length, sampling and extras (penalties, logprobs).
SETTINGS = [
    dict(max_tokens=10),
    dict(max_tokens=9, temperature=0.8, top_k=20, seed=11),
    dict(max_tokens=12, temperature=1.0, top_p=0.9, min_p=0.05, seed=3, repetition_penalty=1.3,
         presence_penalty=0.5),
    dict(max_tokens=8, temperature=0.7, seed=7, logprobs=3),
]


@pytest.fixture(scope="module")
def batched(demo, device):
    return metalqwen.load(demo, device=device, max_context=320, kv_bits=8, progress=False, max_sequences=4,
                          speculative="lookup")


@pytest.fixture(scope="module")
def prompts(batched):
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(0, batched.config.vocab_size, n)] for n in (7, 19, 3, 11)]


class Oracle:
    """Drafts the known continuation, wrong at depth 1, 2, 3, ... in turn."""

    def __init__(self, continuation, prompt_len):
        self.continuation, self.prompt_len, self.steps = continuation, prompt_len, 0

    def draft(self, history, k):
        done = len(history) - self.prompt_len
        drafts = list(self.continuation[done:done + k])
        wrong = self.steps % 4 + 1
        self.steps += 1
        if wrong <= len(drafts):
            drafts[wrong - 1] = (drafts[wrong - 1] + 1) % 1000
        return drafts


def alone(model, prompt, speculative="off", **options):
    """The request run by itself in slot 0 (plainly decoded unless told), from a cold state."""
    model.reset()
    chunks = list(model.stream(prompt, speculative=speculative, **options))
    return model.last_tokens, [(c.logprob, c.top_logprobs) for c in chunks if c.token is not None]


def logprobs_of(seq):
    return [(c.logprob, c.top_logprobs) for c in seq.chunks if c.token is not None]


def test_four_sequences_in_shared_steps_equal_each_alone(batched, prompts):
    want = [alone(batched, p, **s) for p, s in zip(prompts, SETTINGS)]
    steps = batched.counters()["steps"]
    scheduler = Scheduler(batched)
    seqs = [scheduler.submit(p, speculative="off", **s) for p, s in zip(prompts, SETTINGS)]
    scheduler.run()
    for seq, (tokens, logprobs) in zip(seqs, want):
        assert seq.output.tokens == tokens
        assert logprobs_of(seq) == logprobs
    generated = sum(len(s.output.tokens) for s in seqs)
    # 4 prompt feeds, then shared steps: far fewer command buffers than tokens.
    assert batched.counters()["steps"] - steps < generated - 4


def test_joining_finishing_early_and_cancelled_sequences(batched, prompts):
    want = [alone(batched, p, **s)[0] for p, s in zip(prompts, SETTINGS)]
    scheduler = Scheduler(batched)
    first = scheduler.submit(prompts[0], speculative="off", **SETTINGS[0])
    early = scheduler.submit(prompts[1], speculative="off", **{**SETTINGS[1], "max_tokens": 2})
    doomed = scheduler.submit(prompts[2], speculative="off", **SETTINGS[2])
    for _ in range(4):
        scheduler.step()
    scheduler.cancel(doomed)
    late = scheduler.submit(prompts[3], speculative="off", **SETTINGS[3])  # joins mid-way, into the freed slots
    scheduler.run()
    assert first.output.tokens == want[0]
    assert early.output.tokens == want[1][:2] and early.output.finish_reason == "length"
    assert doomed.cancelled and doomed.finished and doomed.output.tokens == want[2][: len(doomed.output.tokens)]
    assert late.output.tokens == want[3]


def test_more_requests_than_slots_wait_for_one(batched, prompts):
    ids = prompts + [prompts[0][:5], prompts[1][:9]]
    want = [alone(batched, p, max_tokens=6)[0] for p in ids]
    got = batched.generate_batch(ids, max_tokens=6, speculative="off")
    assert [g.tokens for g in got] == want


def test_greedy_speculative_sequences_in_shared_steps_equal_plain_decoding(batched, prompts):
    """Drafts of the known answers, wrong at a cycling depth, so steps accept and reject."""
    settings = [dict(max_tokens=14), dict(max_tokens=12, temperature=0.9, seed=2), dict(max_tokens=14),
                dict(max_tokens=3)]
    want = [alone(batched, p, **s)[0] for p, s in zip(prompts, settings)]
    scheduler = Scheduler(batched)
    drafters = [Oracle(w, len(p)) if "temperature" not in s else "off" for p, s, w in zip(prompts, settings, want)]
    seqs = [scheduler.submit(p, speculative=d, **s) for p, s, d in zip(prompts, settings, drafters)]
    scheduler.run()
    assert [s.output.tokens for s in seqs] == want
    drafted = sum(s.output.stats.drafted for s in seqs)
    assert drafted > 0 and 0 < sum(s.output.stats.accepted for s in seqs) < drafted


def test_a_sampled_speculative_sequence_draws_as_it_does_alone(batched, prompts):
    """Speculative sampling keeps the distribution, not plain decoding's draws: batched, a
    seeded request draws exactly what the same speculative request draws alone."""
    sampled = dict(max_tokens=12, temperature=0.9, seed=2)
    plain = alone(batched, prompts[1], **sampled)[0]
    want = alone(batched, prompts[1], speculative=Oracle(plain, len(prompts[1])), **sampled)[0]
    scheduler = Scheduler(batched)
    seq = scheduler.submit(prompts[1], speculative=Oracle(plain, len(prompts[1])), **sampled)
    other = scheduler.submit(prompts[0], max_tokens=12, speculative="off")
    scheduler.run()
    assert seq.output.tokens == want and seq.output.stats.drafted > 0
    assert other.output.tokens == alone(batched, prompts[0], max_tokens=12)[0]


def test_sequences_past_the_split_length_of_decode_attention(batched):
    """Contexts over 128 positions take split attention: each slot's splits are its own."""
    rng = np.random.default_rng(9)
    long = [[int(t) for t in rng.integers(0, batched.config.vocab_size, n)] for n in (150, 40, 200)]
    want = [alone(batched, p, max_tokens=5)[0] for p in long]
    assert [g.tokens for g in batched.generate_batch(long, max_tokens=5, speculative="off")] == want


def test_step_refuses_what_it_cannot_run(batched, prompts):
    engine = batched._engine
    engine.reset(1)
    engine.prefill(1, prompts[0])
    engine.reset(2)
    with pytest.raises(RuntimeError, match="slot 2 holds no sequence"):
        engine.step([(1, [], Sampling()), (2, [], Sampling())])
    with pytest.raises(RuntimeError, match="listed twice"):
        engine.step([(1, [], Sampling()), (1, [], Sampling())])
    with pytest.raises(RuntimeError, match="outside 0..3"):
        engine.step([(4, [], Sampling())])
    with pytest.raises(RuntimeError, match="exceed max_draft"):
        engine.step([(1, [1] * 5, Sampling())])
    with pytest.raises(RuntimeError, match="no penalties or logprobs"):
        engine.step([(1, [1], Sampling(logprobs=2))])
    with pytest.raises(ValueError, match="unknown sampling keyword 'temp'"):
        engine.step([(1, [], Sampling(temp=1.0))])
    with pytest.raises(RuntimeError, match="outside 0..3"):
        engine.reset(7)


def test_slots_cost_memory_and_are_bounded(demo, device, batched):
    one = metalqwen.load(demo, device=device, max_context=320, kv_bits=8, progress=False, speculative="lookup")
    assert batched.counters()["memory_estimate"] > one.counters()["memory_estimate"]
    with pytest.raises(ValueError, match="max_sequences must be an integer in 1..8"):
        metalqwen.load(demo, device=device, max_sequences=9, progress=False)


def test_shared_steps_run_without_speculation_reserved(demo, device):
    """Engine.step accepts its rows' tokens as verify steps do: a model loaded with
    speculative="off" (no draft rows) steps too, and a lone prompt gets what generate gives."""
    m = metalqwen.load(demo, device=device, max_context=64, progress=False, max_sequences=2)
    m.generate([5, 6, 7], max_tokens=4)
    want = m.last_tokens
    m.reset()
    assert m.generate_batch([[5, 6, 7]], max_tokens=4)[0].tokens == want


def test_a_shared_step_has_the_barriers_of_a_one_sequence_step(batched, prompts):
    """Four sequences in one step: the same dependent dispatches as one sequence alone; only
    the per-sequence embeds and acceptances are added, beside the first one's (no barrier)."""
    engine = batched._engine
    for slot, p in enumerate(prompts):
        engine.reset(slot)
        engine.prefill(slot, p)
    engine.step([(0, [], Sampling())])
    one = batched.counters()
    engine.step([(slot, [], Sampling()) for slot in range(4)])
    four = batched.counters()
    assert four["barriers_last_step"] == one["barriers_last_step"]
    assert four["dispatches_last_step"] == one["dispatches_last_step"] + 2 * 3
