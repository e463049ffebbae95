"""The engine's layer range and the layer split, in one process: two engines of layers [0, 2)
and [2, 4), rows moved between them by hand, give the whole model's logits and tokens bit for
bit; splits that do not cover the layers or do not fit are refused naming the rank."""

import signal

import numpy as np
import pytest

import metalqwen
from metalqwen import _core, pipeline
from metalqwen.errors import EngineError

from . import rank_script

PROMPT = [5, 17, 300, 42, 8, 99, 123, 7, 64, 250]


@pytest.fixture(scope="module")
def engines(tiny, device):
    desc = metalqwen.load_checkpoint(tiny).describe()

    def engine(first=0, end=-1, **options):
        return _core.Engine(device._native, desc["dims"], desc["tensors"], 64, 16, 4, first_layer=first,
                            end_layer=end, **options)

    return engine(), engine(0, 2), engine(2, 4), engine


def through(first, second, rows: int, step):
    """step(engine) on the first engine, its residual rows into the second, step(second)."""
    out = step(first)
    second.residual_rows()[:rows] = first.residual_rows()[:rows]
    return out, step(second)


def test_two_ranges_give_the_whole_models_bits(engines):
    whole, first, second, _ = engines
    assert (first.embeds, first.has_head, second.embeds, second.has_head) == (True, False, False, True)
    want = whole.prefill(0, PROMPT, logits="all")
    got = []
    for start in range(0, len(PROMPT), 4):  # a chunk per call on the engine that does not embed
        part = PROMPT[start:start + 4]

        def chunk(e, part=part):  # logits from the engine with the head only
            return e.prefill(0, part, logits="all" if e.has_head else "none")

        got.append(through(first, second, len(part), chunk)[1])
    np.testing.assert_array_equal(np.concatenate(got).view(np.uint32), want.view(np.uint32))

    sampling = _core.Sampling(temperature=0.8, seed=3)
    whole.reset(0), first.reset(0), second.reset(0)
    whole.prefill(0, PROMPT, sampling)
    whole.decode_begin(0, 5, sampling)
    want_tokens = [whole.decode_next() for _ in range(5)]
    whole.decode_end()
    for start in range(0, len(PROMPT), 4):
        part = PROMPT[start:start + 4]
        through(first, second, len(part), lambda e: e.prefill(0, part, sampling))
    tokens = [second.chosen(0)]

    def decode(e):
        e.decode_begin(0, 2, sampling)
        e.decode_next()
        token = e.decode_next()
        e.decode_end()
        return token

    for _ in range(4):
        first.set_chosen(0, tokens[-1])
        tokens.append(through(first, second, 1, decode)[1])
    assert tokens == want_tokens
    assert first.tokens(0) == second.tokens(0) == whole.tokens(0)[:len(first.tokens(0))]


def test_the_last_range_drafts_with_the_mtp_head_as_the_whole_model(loud_mtp, device):
    """The MTP head on the last range's engine (with the embedding it reads): fed the prompt a chunk
    per call, each with the next chunk's first id (its head's cache rows pair as in one prefill),
    then a verify step of those drafts, it drafts what the whole model's head drafts."""
    desc = metalqwen.load_checkpoint(loud_mtp).describe()

    def engine(first, end, mtp=False):
        tensors = {**desc["tensors"], **desc["mtp"]} if mtp else desc["tensors"]
        return _core.Engine(device._native, desc["dims"], tensors, 64, 16, 4, max_draft=3, first_layer=first,
                            end_layer=end, mtp=mtp)

    whole, first, last = engine(0, -1, mtp=True), engine(0, 2), engine(2, 4, mtp=True)
    whole.prefill(0, PROMPT)
    for start in range(0, len(PROMPT), 4):
        part = PROMPT[start:start + 4]
        then = PROMPT[start + 4] if start + 4 < len(PROMPT) else None
        through(first, last, len(part), lambda e: e.prefill(0, part, next_token=then))
    assert last.chosen(0) == whole.chosen(0)
    drafts = whole.mtp_drafts(0, 3)
    assert last.mtp_drafts(0, 3) == drafts and len(drafts) == 3
    first.set_chosen(0, last.chosen(0))
    want = whole.verify(0, drafts, _core.Sampling())
    got = through(first, last, len(drafts) + 1,
                  lambda e: e.verify(0, drafts, _core.Sampling()) if e.has_head else e.verify_rows(0, drafts))[1]
    first.verify_accept(0, len(drafts), len(got) - 1, got[-1])
    assert got == want
    assert last.mtp_drafts(0, 3) == whole.mtp_drafts(0, 3)
    assert first.tokens(0) == last.tokens(0) == whole.tokens(0)


def shared_step(first, second, entries, prompt=None):
    """One shared step through both ranges: the first's step rows into the second, whose outcome
    the first takes (step_accept); the second's tokens per entry (and the prompt's)."""
    assert first.step(entries, prompt=prompt) == [[]] * (len(entries) + (prompt is not None))
    rows = sum(1 + len(drafts) for _, drafts, _ in entries) + (len(prompt[1]) if prompt else 0)
    second.step_rows()[:rows] = first.step_rows()[:rows]
    got = second.step(entries, prompt=prompt)
    first.step_accept([(slot, len(t) - 1, t[-1]) for (slot, _, _), t in zip(entries, got)],
                      prompt_token=got[-1][0] if prompt and prompt[3] else None)
    return got


def test_a_shared_step_through_two_ranges_gives_the_whole_models_bits(tiny, device):
    """Three slots: a greedy one with drafts half right, a sampled one, and a prompt joining a
    chunk per step; over several rounds the tokens, then the states (the logits of one more
    token), are the whole engine's bit for bit."""
    desc = metalqwen.load_checkpoint(tiny).describe()

    def engine(first=0, end=-1):
        return _core.Engine(device._native, desc["dims"], desc["tensors"], 64, 16, 4, max_draft=3, max_sequences=3,
                            first_layer=first, end_layer=end)

    whole, first, second = engine(), engine(0, 2), engine(2, 4)
    needs = _core.estimate_memory(desc["dims"], desc["tensors"], 64, 16, 4, max_sequences=3, first_layer=0,
                                  end_layer=2, max_draft=3)
    assert needs["total"] == first.counters()["memory_estimate"]  # step_rows counted
    assert first.step_rows().shape == (first.max_step_rows + first.max_rows, 128)
    greedy, sampled = _core.Sampling(), _core.Sampling(temperature=0.8, seed=3)
    whole.prefill(0, PROMPT)
    whole.decode_begin(0, 12)
    future = [whole.chosen(0)] + [whole.decode_next() for _ in range(12)][1:]
    whole.decode_end()
    whole.reset(0)
    for slot, prompt, sampling in ((0, PROMPT, greedy), (1, PROMPT[3:], sampled)):
        whole.prefill(slot, prompt, sampling)
        for start in range(0, len(prompt), 4):
            part = prompt[start:start + 4]
            through(first, second, len(part), lambda e: e.prefill(slot, part, sampling))
        first.set_chosen(slot, second.chosen(slot))
    joining = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11]
    fed, tokens = 0, {0: [whole.chosen(0)], 1: [whole.chosen(1)], 2: []}
    for round in range(5):
        n = len(tokens[0])  # two right drafts, then a wrong one (its rows rolled back)
        drafts = future[n:n + 2] + [future[n + 2] + 1] if round % 2 == 0 else []
        entries = [(0, drafts, greedy), (1, [], sampled)]
        prompt = None
        if fed < len(joining):
            part = joining[fed:fed + 4]
            fed += len(part)
            prompt = (2, part, greedy, fed == len(joining), False)
        want = whole.step(entries, prompt=prompt)
        assert shared_step(first, second, entries, prompt) == want
        for slot, got in zip((0, 1, 2), want):
            tokens[slot] += got
        if round % 2 == 0:
            assert len(want[0]) == 3  # two drafts accepted
    assert len(tokens[2]) == 1 and tokens[0] == future[:len(tokens[0])]
    for slot in range(3):
        assert first.tokens(slot) == second.tokens(slot) == whole.tokens(slot)
        assert first.chosen(slot) == second.chosen(slot) == whole.chosen(slot)
        want = whole.prefill(slot, [whole.chosen(slot)], logits="last")
        got = through(first, second, 1, lambda e: e.prefill(slot, [e.chosen(slot)],
                                                          logits="last" if e.has_head else "none"))[1]
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mtp_entries_of_a_shared_step_through_two_ranges(tiny_moe_mtp, device):
    """MTP entries across two ranges as pipeline_steps.RankSteps runs them: after each step the
    last range's head drafts ahead (its depth) for each slot drafting with it, and the next step
    feeds the first k of them as the drafts on both ranges (the last range's entry names them MTP
    drafts: it runs the head over the step's rows); a prompt joining a chunk per step then drafts
    first with drafts made just before its step. Two slots (greedy, seeded sampling), k of 2 and 3,
    a step without MTP entries (no head state after it: one row, then drafts again): the drafts
    are the ones the whole model's step makes, drafts accepted and refused, the tokens and then
    the states its own."""
    desc = metalqwen.load_checkpoint(tiny_moe_mtp).describe()

    def engine(first, end, mtp):
        tensors = {**desc["tensors"], **desc["mtp"]} if mtp else desc["tensors"]
        return _core.Engine(device._native, desc["dims"], tensors, 64, 16, 4, max_draft=3, max_sequences=3,
                            first_layer=first, end_layer=end, mtp=mtp)

    whole, first, last = engine(0, -1, True), engine(0, 2, False), engine(2, 4, True)
    greedy, sampled = _core.Sampling(), _core.Sampling(temperature=0.8, seed=3)
    for slot, prompt, sampling in ((0, PROMPT, greedy), (1, PROMPT[3:], sampled)):
        whole.prefill(slot, prompt, sampling)
        for start in range(0, len(prompt), 4):
            part, then = prompt[start:start + 4], prompt[start + 4] if start + 4 < len(prompt) else None
            through(first, last, len(part), lambda e: e.prefill(slot, part, sampling, next_token=then))
        first.set_chosen(slot, last.chosen(slot))
    ahead = {}  # slot -> the drafts the last range's head made after the slot's step (3 within the context)
    joining, fed, drafted = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11], 0, 0
    # Per round the MTP drafts asked of slots 0, 1 (and 2 once its prompt is in); round 3 asks none.
    asks = [(2, 3), (3, 2), (3, 3), (0, 0), (3, 3), (1, 2, 2), (2, 2, 1)]  # at most 8 rows a step
    for round, ask in enumerate(asks):
        slots = [(0, greedy), (1, sampled), (2, greedy)][:len(ask)]
        prompt = None
        if fed < len(joining):
            part = joining[fed:fed + 4]
            fed += len(part)
            prompt = (2, part, greedy, fed == len(joining), False)
        assert [whole.mtp_ready(s) for s in range(3)] == [last.mtp_ready(s) for s in range(3)]
        drafts = []
        for (slot, _), k in zip(slots, ask):
            if k and last.mtp_ready(slot) and slot not in ahead:  # the first after its prompt: made now
                ahead[slot] = last.mtp_drafts(slot, k)
            drafts.append(ahead[slot][:k] if k and last.mtp_ready(slot) else [])
            if drafts[-1]:  # the drafts the whole model's step makes (mtp_drafts writes past the position only)
                assert whole.mtp_drafts(slot, k) == drafts[-1], (round, slot)
        drafted += sum(map(len, drafts))
        want = whole.step([(slot, [], sampling, k) for (slot, sampling), k in zip(slots, ask)], prompt=prompt)
        assert first.step([(slot, d, sampling) for (slot, sampling), d in zip(slots, drafts)],
                          prompt=prompt) == [[]] * len(want)
        rows = sum(1 + len(d) for d in drafts) + (len(prompt[1]) if prompt else 0)
        last.step_rows()[:rows] = first.step_rows()[:rows]
        got = last.step([(slot, d, sampling, k) for (slot, sampling), d, k in zip(slots, drafts, ask)], prompt=prompt)
        first.step_accept([(slot, len(t) - 1, t[-1]) for (slot, _), t in zip(slots, got)],
                          prompt_token=got[-1][0] if prompt and prompt[3] else None)
        assert got == want, round
        for slot, _ in slots:
            ahead.pop(slot, None)
            if last.mtp_ready(slot):
                ahead[slot] = last.mtp_drafts(slot, min(3, last.max_context - last.position(slot) - 2))
        if prompt:  # a new prompt in slot 2: nothing made ahead for it
            ahead.pop(2, None)
    assert drafted > 0 and whole.counters()["drafted"] == last.counters()["drafted"] == drafted
    assert 0 < last.counters()["accepted"] == whole.counters()["accepted"] < drafted
    for slot in range(3):
        assert first.tokens(slot) == last.tokens(slot) == whole.tokens(slot)
        want = whole.prefill(slot, [whole.chosen(slot)], logits="last")
        got = through(first, last, 1, lambda e: e.prefill(slot, [e.chosen(slot)],
                                                        logits="last" if e.has_head else "none"))[1]
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_each_range_holds_only_its_tensors(engines, tiny):
    whole, first, second, _ = engines
    desc = metalqwen.load_checkpoint(tiny).describe()
    layer = [sum(e[2] for e in entry["tensors"].values()) for entry in desc["layers"]]
    embed = sum(e[2] for n, e in desc["globals"].items() if "embed_tokens" in n)
    norm = desc["globals"]["language_model.model.norm.weight"][2]
    # Tied embeddings: the last range keeps the table as its lm_head.
    assert first.counters()["weight_bytes"] == embed + layer[0] + layer[1]
    assert second.counters()["weight_bytes"] == layer[2] + layer[3] + embed + norm
    assert whole.counters()["weight_bytes"] == sum(layer) + embed + norm
    needs = _core.estimate_memory(desc["dims"], desc["tensors"], 64, 16, 4, first_layer=0, end_layer=2)
    assert needs["weights"] == first.counters()["weight_bytes"]
    assert needs["total"] == first.counters()["memory_estimate"]


def test_range_refusals(engines):
    whole, first, second, engine = engines
    with pytest.raises(EngineError, match=r"layers \[3, 3\) are not a non-empty range of the model's 4 layers"):
        engine(3, 3)
    with pytest.raises(EngineError, match=r"layers \[2, 5\)"):
        engine(2, 5)
    with pytest.raises(EngineError, match=r"the MTP head goes with the lm_head \(the last layers' engine\): not "
                                          r"with layers \[0, 2\)"):
        engine(0, 2, mtp=True)
    with pytest.raises(EngineError, match="one chunk of input rows per call"):
        second.prefill(0, PROMPT)
    with pytest.raises(EngineError, match="an engine up to layer 2 computes no logits"):
        first.prefill(0, PROMPT[:4], logits="last")
    with pytest.raises(EngineError, match="takes one step per decode"):
        first.decode_begin(0, 3)
    with pytest.raises(EngineError, match=r"an engine of a layer range takes shared steps with max_sequences > 1"):
        first.step([(0, [], _core.Sampling())])
    with pytest.raises(EngineError, match="no shared step waits for the head's outcome"):
        first.step_accept([(0, 0, 1)])
    with pytest.raises(EngineError, match="the engine with the head accepts by itself"):
        second.step_accept([(0, 0, 1)])


def test_split_parsing_and_fit():
    assert pipeline.parse_split("0:1, 1:4", 4, 2) == [(0, 1), (1, 4)]
    for text, message in [("0:2,2:3", "ends at layer 3, but the model has 4 layers"),
                          ("0:2", "1 ranges for 2 ranks"), ("0:2,1:4", "rank 1's range 1:4 must start at layer 2"),
                          ("0:2,x:4", "'x:4' is not first:end")]:
        with pytest.raises(ValueError, match=message):
            pipeline.parse_split(text, 4, 2)
    # In proportion to memory, at least one layer each.
    assert pipeline.proportional_split([10] * 4, [1, 1]) == [(0, 2), (2, 4)]
    assert pipeline.proportional_split([10] * 4, [3, 1]) == [(0, 3), (3, 4)]
    assert pipeline.proportional_split([10] * 4, [100, 1]) == [(0, 3), (3, 4)]
    need = {"total": 300, "weights": 200, "kv_cache": 60, "workspace": 40}
    pipeline.check_fits([(0, 2), (2, 4)], [need, need], [300, 300])
    with pytest.raises(ValueError, match=r"rank 1 \(layers 2:4\) needs 300 bytes \(weights 200 \+ KV cache 60 "
                                         r"\+ workspace 40\) but its GPU may use 299 bytes"):
        pipeline.check_fits([(0, 2), (2, 4)], [need, need], [300, 299])


def test_load_refuses_what_pipelines_do_not_run_yet(tiny):
    with pytest.raises(metalqwen.CheckpointError, match="speculative='mtp', but"):  # no head in the folder
        metalqwen.load(tiny, distributed="pipeline", speculative="mtp")
    with pytest.raises(ValueError, match="layer_split needs distributed='pipeline'"):
        metalqwen.load(tiny, layer_split="0:2,2:4")


def test_one_rank_pipeline_runs_and_refuses_what_it_does_not_run_yet(tiny, device):
    """Outside mlx.launch the group has one rank: the whole model, the same tokens as load()."""
    previous = signal.getsignal(signal.SIGTERM)  # load(distributed=...) turns SIGTERM into an error
    options = dict(device=device, max_context=64, kv_bits=16, prefill_chunk=4, progress=False)
    try:
        model = metalqwen.load(tiny, **options, distributed="pipeline")
        assert model.split == [(0, 4)] and model.rank == 0
        alone = metalqwen.load(tiny, **options)
        assert model.generate(PROMPT, max_tokens=3).tokens == alone.generate(PROMPT, max_tokens=3).tokens
        mine = [(c.logprob, c.top_logprobs) for c in model.stream(PROMPT, max_tokens=3, logprobs=2)]
        theirs = [(c.logprob, c.top_logprobs) for c in alone.stream(PROMPT, max_tokens=3, logprobs=2)]
        assert mine == theirs and theirs[0][0] is not None
        schema = rank_script.SCHEMA  # the last rank's masks: here the one rank's
        assert (model.generate(PROMPT, max_tokens=8, json_schema=schema).tokens
                == alone.generate(PROMPT, max_tokens=8, json_schema=schema).tokens)
        # The prefix cache: hits at a boundary and at a prompt's end give the cold runs' tokens and logprobs.
        cached = rank_script.cached(metalqwen.load(tiny, **options, distributed="pipeline", prefix_cache_bytes=2**20))
        cold = []
        for ids in rank_script.CACHED:
            alone.reset()
            cold.append([[c.token, c.logprob, [list(e) for e in c.top_logprobs]]
                         for c in alone.stream(ids, max_tokens=4, logprobs=3) if c.token is not None])
        assert cached["reused"] == [6, 10] and cached["cached"] == cold
        with pytest.raises(EngineError, match="mtp_logits is not yet supported with distributed='pipeline'"):
            model.mtp_logits(PROMPT)
        # Shared steps (one rank: the whole engine's) through the pipeline's Scheduler engine.
        batched = metalqwen.load(tiny, **options, distributed="pipeline", max_sequences=2, speculative="lookup")
        prompts = [PROMPT, PROMPT[:4] * 3, PROMPT[2:]]
        assert ([g.tokens for g in batched.generate_batch(prompts, max_tokens=6)]
                == [alone.generate(p, max_tokens=6).tokens for p in prompts])
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_one_rank_pipeline_batches_with_mtp_drafts_as_one_process(tiny_moe_mtp, device):
    """pipeline_steps.RankSteps on one rank (the whole engine, given the head's drafts made ahead):
    generate_batch with the MTP head gives one process's tokens, drafts and seeded draws."""
    previous = signal.getsignal(signal.SIGTERM)
    options = dict(device=device, max_context=64, kv_bits=16, prefill_chunk=4, progress=False, speculative="auto",
                   max_sequences=3)
    try:
        model = metalqwen.load(tiny_moe_mtp, **options, distributed="pipeline")
        alone = metalqwen.load(tiny_moe_mtp, **options)
        assert model.speculative == alone.speculative == "mtp"
        for sampling in ({}, rank_script.SAMPLED):
            got, want = (m.generate_batch(rank_script.BATCH, max_tokens=10, **sampling) for m in (model, alone))
            assert [(g.tokens, g.stats.drafted, g.stats.accepted) for g in got] == \
                [(g.tokens, g.stats.drafted, g.stats.accepted) for g in want]
            assert all(g.stats.drafted > 0 for g in want)
            if not sampling:
                assert all(g.stats.accepted > 0 for g in want)
    finally:
        signal.signal(signal.SIGTERM, previous)
