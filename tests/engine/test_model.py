"""The whole model on the CPU runtime against mlx-lm computing in float32.

Checkpoints are tiny random Qwen3.5 models converted by mlx-lm's own converter
(model_fixtures.VARIANTS): both layer types, head_dim 256, linear head dims 128, tied
and untied, full_attention_interval 4 and 2, and every weight format: affine 2/3/4/5/6/8-bit
at groups 32/64/128 (per-module overrides and mlx-lm's mixed_3_6 recipe), mxfp4, nvfp4,
mxfp8, and bf16 projections, embeddings and lm_head (whole folder and single modules).
"""

from __future__ import annotations

import numpy as np
import pytest

import metalqwen

from ..support import model_fixtures as mf
from ..support.model_checks import assert_logits_close, logit_tolerance, prompt, up_to_eos

RUNNABLE = ["base", "wide_untied_g32", "flat_b8"]
# Weight formats (model_fixtures.VARIANTS): the KV cache does not depend on them, so one cache each.
FORMATS = ["mixed", "affine_bits", "recipe_3_6", "fp_modes", "bf16", "f16", "f32"]
CASES = [(name, kv_bits) for name in RUNNABLE for kv_bits in (16, 8)] + [(name, 16) for name in FORMATS]


@pytest.mark.parametrize("name,kv_bits", CASES)
def test_logits_at_every_position_match_mlx_lm(converted, name, kv_bits, model):
    path = converted(name)[1]
    config = metalqwen.load_checkpoint(path).config
    ids = prompt(config.vocab_size, 40, seed=len(name))
    want = mf.reference_logits(path, ids)
    assert_logits_close(model(path, kv_bits).score(ids), want, logit_tolerance(config, kv_bits))


@pytest.mark.parametrize("name,kv_bits", CASES)
def test_greedy_continuation_matches_mlx_lm(converted, name, kv_bits, model):
    path = converted(name)[1]
    ids = prompt(metalqwen.load_checkpoint(path).config.vocab_size, 12, seed=1)
    out = model(path, kv_bits).generate(ids, max_tokens=20)
    assert out.tokens == up_to_eos(mf.reference_greedy(path, ids, 20), model(path, kv_bits).eos_token_ids)


def test_prefill_in_chunks_and_token_by_token_agree(converted, model):
    path = converted("base")[1]
    ids = prompt(1000, 37, seed=5)
    # 64: one GEMM chunk; 16 and 9: several chunks; 8: verify-sized steps; 1: decode steps.
    runs = {chunk: model(path, 16, chunk).score(ids) for chunk in (64, 16, 9, 8, 1)}
    for chunk, logits in runs.items():
        # Same math, different kernels and summation orders (GEMM vs matvec).
        np.testing.assert_allclose(logits, runs[64], rtol=0, atol=1e-4 * np.abs(runs[64]).max(), err_msg=str(chunk))


def test_streamed_text_equals_generate_and_reuses_the_cache(converted, model):
    m = model(converted("base")[1])
    ids = prompt(900, 10, seed=2)
    full = m.generate(ids, max_tokens=12)
    chunks = list(m.stream(ids, max_tokens=12))
    assert "".join(c.text for c in chunks) == full.text
    assert [c.token for c in chunks if c.token is not None] == full.tokens
    # A follow-up prompt extending the conversation feeds only its new tokens.
    follow = ids + full.tokens + prompt(900, 5, seed=3)
    again = m.generate(follow, max_tokens=6)
    assert 0 < again.stats.prompt_tokens_reused < len(follow)
    m.reset()
    fresh = m.generate(follow, max_tokens=6)
    assert fresh.stats.prompt_tokens_reused == 0 and fresh.tokens == again.tokens


def test_sampling_is_reproducible_and_top_k_1_is_greedy(converted, model):
    m = model(converted("base")[1])
    ids = prompt(900, 8, seed=4)
    greedy = m.generate(ids, max_tokens=10).tokens
    assert m.generate(ids, max_tokens=10, temperature=0.8, top_k=1, seed=1).tokens == greedy
    a = m.generate(ids, max_tokens=10, temperature=1.5, seed=7).tokens
    b = m.generate(ids, max_tokens=10, temperature=1.5, seed=7).tokens
    c = m.generate(ids, max_tokens=10, temperature=1.5, seed=8).tokens
    assert a == b and a != c


def test_stops_at_stop_strings_and_max_tokens(demo, model):
    m = model(demo)
    out = m.generate("hello", chat=True, max_tokens=16)
    assert out.finish_reason in ("stop", "length") and 1 <= len(out.tokens) <= 16
    if len(out.text) > 3:
        stop = out.text[2:4]
        cut = m.generate("hello", chat=True, max_tokens=16, stop=[stop])
        assert cut.finish_reason == "stop" and cut.text == out.text[: out.text.index(stop)]
    one = m.generate("hello", chat=True, max_tokens=1)
    assert len(one.tokens) == 1 and one.tokens[0] == out.tokens[0]


def test_counters_show_one_command_buffer_per_step(demo, model):
    m = model(demo)
    before = m.counters()
    out = m.generate([5, 6, 7], max_tokens=9)
    after = m.counters()
    decode_steps = after["tokens_decoded"] - before["tokens_decoded"]
    assert decode_steps == len(out.tokens) - 1
    assert after["steps"] - before["steps"] == decode_steps + 1  # + one prefill chunk
    assert after["cpu_waits"] - before["cpu_waits"] == decode_steps + 1
    assert after["dispatches_last_step"] > 10 and after["weight_bytes_per_token"] > 0
    # Step t+1 was committed before step t was waited for.
    assert after["max_steps_in_flight"] == 2


def layer_dispatches(kind: str, split: bool = False) -> int:
    """Dispatches of one layer on the matvec path (1..8 rows), each one a barrier: the input
    norm (+ the residual add) runs inside the one dispatch of all input projections, the post
    norm inside gate/up, whose epilogue applies silu(gate) * up. At a context of at most 128
    positions attention is one split; past it (`split`) the combine follows the decode."""
    if kind == "linear_attention":
        # norm + in_proj_qkv/z/b/a; conv + gates + scan + gated norm but its per-head factor (+ history
        # ring); out_proj with the per-head factor in its input load
        return 3
    return 3 + split  # norm + q/k/v_proj, decode (q/k norm + rope + append inside), o_proj


MLP_DISPATCHES = 2  # post norm + residual + gate/up + silu, down_proj
# The sparse MoE block on the matvec path, as (dispatches, barriers): (1) the shared expert's
# gate/up + silu with the post norm, beside the post norm's router + shared_expert_gate (one
# dispatch: mlx-lm quantizes both alike); (2) each (row, expert) pair's routing + gate/up + silu,
# beside the shared expert's down_proj; (3) the experts' down_proj + the weighted sum + the gated
# shared expert.
MOE_MLP = (5, 3)


def mlp_structure(moe: bool) -> tuple[int, int]:
    return MOE_MLP if moe else (MLP_DISPATCHES, MLP_DISPATCHES)


def decode_step_structure(layer_types: list[str], split: bool = False, moe: bool = False) -> tuple[int, int]:
    """(dispatches, barriers) of a greedy one-row decode step, as Engine::encode_forward and encode_choice encode
    it: embed, the layers (with MoE blocks when `moe`), the final norm fused into the lm_head,
    argmax partial and final; nothing overlaps but inside a MoE block. Change these when the
    structure changes, on purpose."""
    mlp_dispatches, mlp_barriers = mlp_structure(moe)
    dispatches = 1 + sum(layer_dispatches(k, split) + mlp_dispatches for k in layer_types) + 1 + 2
    return dispatches, dispatches - 1 - len(layer_types) * (mlp_dispatches - mlp_barriers)


def verify_step_structure(layer_types: list[str], moe: bool = False) -> tuple[int, int]:
    """(dispatches, barriers) of a greedy verify step with host drafts (2..8 rows): the layers
    as decode's, the lm_head over every row, argmax over the rows, spec_accept, and each
    DeltaNet layer's rollback (all after one barrier)."""
    linear = sum(k == "linear_attention" for k in layer_types)
    mlp_dispatches, mlp_barriers = mlp_structure(moe)
    dispatches = 1 + sum(layer_dispatches(k) + mlp_dispatches for k in layer_types) + 1 + 2 + 1 + linear
    overlapped = max(linear - 1, 0) + len(layer_types) * (mlp_dispatches - mlp_barriers)
    return dispatches, dispatches - 1 - overlapped


def test_counters_count_the_dispatches_and_barriers_of_a_decode_step(demo, model):
    m = model(demo)
    engine = m._engine
    engine.reset(0)
    engine.prefill(0, [5, 6, 7])
    before = m.counters()
    engine.decode_begin(0, 3)
    while engine.decode_next() is not None:
        pass
    engine.decode_end()
    after = m.counters()
    steps = after["steps"] - before["steps"]
    assert steps == 2  # max_tokens 3: the prefill chose the first token
    dispatches, barriers = decode_step_structure(m.config.layer_types)
    assert (after["dispatches_last_step"], after["barriers_last_step"]) == (dispatches, barriers)
    assert after["dispatches"] - before["dispatches"] == steps * dispatches
    assert after["barriers"] - before["barriers"] == steps * barriers
    assert 0 < after["host_encode_us_last_step"] <= after["host_encode_us"] - before["host_encode_us"]


@pytest.mark.parametrize("drafts", [1, 7])
def test_counters_count_the_dispatches_and_barriers_of_a_verify_step(demo, device, drafts):
    m = metalqwen.load(demo, device=device, max_context=160, kv_bits=16, progress=False, speculative="lookup",
                       draft_depth=7)
    engine = m._engine
    engine.prefill(0, [5, 6, 7])
    engine.verify(0, [8] * drafts)
    dispatches, barriers = verify_step_structure(m.config.layer_types)
    assert (m.counters()["dispatches_last_step"], m.counters()["barriers_last_step"]) == (dispatches, barriers)


def test_counters_count_the_combine_of_a_split_decode_step(demo, model):
    """Past 128 positions a decode step's attention is two barrier stages: decode (+ prep,
    + append) and the combine of the split partials."""
    m = model(demo)
    engine = m._engine
    engine.reset(0)
    engine.prefill(0, list(range(5, 145)))  # the demo model holds 160 positions
    engine.decode_begin(0, 2)
    while engine.decode_next() is not None:
        pass
    engine.decode_end()
    after = m.counters()
    dispatches, barriers = decode_step_structure(m.config.layer_types, split=True)
    assert (after["dispatches_last_step"], after["barriers_last_step"]) == (dispatches, barriers)


def test_long_context_decode_splits_the_cache_and_matches_mlx_lm(converted, device):
    """Past 128 positions decode attention splits the context across threadgroups and
    merges the partials (attn_decode_combine); prefill runs several GEMM chunks."""
    path = converted("base")[1]
    ids = prompt(1000, 300, seed=9)
    m = metalqwen.load(path, device=device, max_context=320, kv_bits=16, progress=False)
    want = mf.reference_greedy(path, ids, 8)
    eos = set(m.eos_token_ids)
    if any(t in eos for t in want):
        want = want[: next(i for i, t in enumerate(want) if t in eos)]
    assert m.generate(ids, max_tokens=8).tokens == want
