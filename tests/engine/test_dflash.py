"""DFlash block-diffusion drafting (issue 28), first stage: a drafter folder built with the
reference's own classes (mlx-vlm's DFlashDraftModel) for the tiny "base" target; loading and its
errors; the target's hidden states captured in the forward pass against the float64 numpy model;
the drafter's block logits against the reference drafter given the same hidden states; and
speculative rounds whose greedy output equals plain decoding's."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import metalqwen
from metalqwen import _core, speculative as spec
from metalqwen.checkpoint import CheckpointError, load_checkpoint
from metalqwen.dflash_checkpoint import load_drafter

from ..support import dflash_fixtures as df
from ..support import model_fixtures as mf
from ..support.cli import call as call_cli
from ..support.model_checks import assert_logits_close, prompt

# Layers 1 (Gated DeltaNet) and 3 (the last, full attention) of the 4-layer "base" target.
TARGET_LAYERS = (1, 3)
CONTEXT = 192
DRAFTS = min(_core.MAX_DRAFT, 15)  # the most drafts of the test drafter's 16-row block


@pytest.fixture(scope="module")
def target(converted):
    _, mlx = converted("base")
    return mlx


@pytest.fixture(scope="module")
def drafter(target, tmp_path_factory):
    cfg = load_checkpoint(target).config
    return df.write_drafter(tmp_path_factory.mktemp("dflash") / "drafter",
                            df.drafter_config(cfg, target_layer_ids=TARGET_LAYERS), seed=3)


@pytest.fixture(scope="module")
def model(target, drafter, device):
    return metalqwen.load(target, device=device, max_context=CONTEXT, kv_bits=16, progress=False, draft=drafter)


def _edited(drafter, tmp_path, edit) -> str:
    folder = shutil.copytree(drafter, tmp_path / "edited")
    mf.edit_json(os.path.join(folder, "config.json"), edit)
    return os.fspath(folder)


# ---------------------------------------------------------------------------- the folder and loading


def test_the_folder_is_what_the_reference_loads(target, drafter):
    ref = df.load_reference(drafter, target)
    assert list(ref.config.target_layer_ids) == list(TARGET_LAYERS) and ref.config.block_size == 16
    with open(os.path.join(drafter, "config.json")) as f:
        raw = json.load(f)
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    header = mf.read_header(os.path.join(drafter, "model.safetensors"))
    names = {n for n in header if n != "__metadata__"}
    assert "fc.weight" in names and "layers.1.self_attn.q_norm.weight" in names
    assert not any(n.startswith("model.") or "embed_tokens" in n or "lm_head" in n for n in names)
    assert {header[n]["dtype"] for n in names} == {"BF16"}
    d = load_drafter(drafter, load_checkpoint(target).config)
    assert (d.layers, d.heads, d.kv_heads, d.head_dim, d.block_size) == (2, 4, 2, 128, 16)
    assert d.target_layer_ids == TARGET_LAYERS and d.mask_token_id == 1023
    assert d.tensors["fc.weight"].shape == (512, 2 * 512)


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", 1024, "field hidden_size is 1024, but the target"),
    ("vocab_size", 2048, "field vocab_size is 2048, but the target"),
    ("num_target_layers", 8, "field num_target_layers is 8, but the target"),
    ("dflash_config", {"target_layer_ids": [1, 4], "mask_token_id": 5}, "holds layer 4, outside the target's layers"),
    ("dflash_config", {"target_layer_ids": [1], "mask_token_id": 1024}, "mask_token_id 1024 is outside"),
    ("dflash_config", {"mask_token_id": 5}, "field dflash_config.target_layer_ids is missing"),
    ("head_dim", 96, "field head_dim is 96"),
    ("architectures", ["Qwen3ForCausalLM"], "not a DFlash drafter"),
    ("architectures", ["DFlash2DraftModel"], "a DFlash2 drafter (architectures ['DFlash2DraftModel']): not supported yet"),
    ("draft_window_size", 1024, "field draft_window_size: a sink + window context cache is not supported"),
])
def test_a_drafter_that_does_not_fit_its_target_is_refused(target, drafter, tmp_path, field, value, message):
    folder = _edited(drafter, tmp_path, lambda c: c.__setitem__(field, value))
    with pytest.raises(CheckpointError, match="config.json") as e:
        load_drafter(folder, load_checkpoint(target).config)
    assert message in str(e.value)


def test_a_bad_tensor_is_named_with_its_file(target, drafter, tmp_path):
    cfg = load_checkpoint(target).config
    folder = shutil.copytree(drafter, tmp_path / "bad")
    path = os.path.join(folder, "model.safetensors")
    mf.rewrite_header(path, lambda h: h["layers.0.self_attn.q_norm.weight"].__setitem__("dtype", "F16"))
    with pytest.raises(CheckpointError, match="model.safetensors: tensor layers.0.self_attn.q_norm.weight: dtype "
                                              "F16, expected BF16 or F32"):
        load_drafter(folder, cfg)
    mf.rewrite_header(path, lambda h: h["layers.0.self_attn.q_norm.weight"].__setitem__("dtype", "BF16"))
    mf.rewrite_header(path, lambda h: h["layers.1.mlp.up_proj.weight"].__setitem__("shape", [512, 1024]))
    with pytest.raises(CheckpointError, match="model.safetensors: tensor layers.1.mlp.up_proj.weight: shape "
                                              r"\[512, 1024\], expected \[1024, 512\]"):
        load_drafter(folder, cfg)
    mf.add_tensors(path, {"layers.0.self_attn.k_proj.scales": ("BF16", (256, 8), bytes(256 * 8 * 2))})
    with pytest.raises(CheckpointError, match="k_proj.scales: not a tensor of a DFlash drafter .quantized"):
        load_drafter(folder, cfg)


def test_load_arguments(target, drafter, device, tmp_path):
    with pytest.raises(ValueError, match="speculative='dflash' needs draft=PATH"):
        metalqwen.load(target, device=device, speculative="dflash")
    with pytest.raises(ValueError, match="goes with speculative='dflash' or 'auto', not 'mtp'"):
        metalqwen.load(target, device=device, speculative="mtp", draft=drafter)
    with pytest.raises(ValueError, match=r"does not yet work with max_sequences > 1 \(docs"):
        metalqwen.load(target, device=device, draft=drafter, max_sequences=2)
    short = _edited(drafter, tmp_path, lambda c: c.__setitem__("block_size", 4))
    with pytest.raises(ValueError, match="draft_depth 5 exceeds what the drafter's block of 4 rows drafts .3."):
        metalqwen.load(target, device=device, draft=short, draft_depth=5)


def test_auto_picks_dflash_with_a_drafter(model):
    assert model.speculative == "dflash" and model._engine.has_dflash
    assert model.draft_depth == DRAFTS  # block_size 16: the whole block


def test_bench_reports_dflash_rounds(target, drafter, device, tmp_path, capfd):
    path = tmp_path / "bench.json"
    out = call_cli(capfd, "bench", "-m", target, "--device", device.kind, "--quick", "--draft", drafter,
                   "--json", str(path))
    assert out.returncode == 0, out.stderr
    spec = json.loads(path.read_text())["metalqwen"]["speculative"]
    # By depth: the acceptance at each block position drafted (8-token runs cap the depth).
    assert spec["verify_steps"] > 0 and spec["drafted"] > 0 and spec["tokens_per_verify_step"] >= 1
    assert 1 <= len(spec["acceptance_by_depth"]) <= DRAFTS
    assert all(0 <= a <= 1 for a in spec["acceptance_by_depth"])
    assert "speculative: " in out.stdout


def test_the_memory_estimate_counts_the_drafter(model, target, drafter, device):
    # The same rollback planes (draft_depth) without the drafter: the difference is the drafter's.
    plain = metalqwen.load(target, device=device, max_context=CONTEXT, kv_bits=16, progress=False,
                           speculative="lookup", draft_depth=model.draft_depth)
    d = load_drafter(drafter, model.config)
    weights = sum(t.nbytes for t in d.tensors.values())
    caches = 2 * d.layers * CONTEXT * d.kv_heads * d.head_dim * 4  # f32 K and V rows per layer, one slot
    rows = 64  # prefill_chunk: the scratch's rows
    per_row = (len(d.target_layer_ids) + 5) * d.hidden + 2 * d.kv_heads * d.head_dim + 2 * d.heads * d.head_dim \
        + 3 * d.intermediate
    grown = model.counters()["memory_estimate"] - plain.counters()["memory_estimate"]
    assert grown == weights + caches + rows * per_row * 4


def test_cli_takes_draft(target, drafter, device, capfd):
    out = call_cli(capfd, "generate", "-m", target, "--device", device.kind, "--draft", drafter, "-p", "Hi",
                   "--max-tokens", "12", "--temperature", "0", "--stats")
    assert out.returncode == 0 and "speculative (dflash): " in out.stderr, out.stderr
    bad = call_cli(capfd, "generate", "-m", target, "--device", device.kind, "--speculative", "dflash", "-p", "Hi")
    assert bad.returncode != 0 and "needs draft=PATH" in bad.stderr, bad.stderr
    batched = call_cli(capfd, "bench", "-m", target, "--device", device.kind, "--quick", "--draft", drafter,
                       "--concurrency", "1,2")
    assert batched.returncode != 0 and "--draft (DFlash) does not batch yet" in batched.stderr, batched.stderr


# ---------------------------------------------------------------------------- the engine


def _prefill(model, ids):
    engine = model._engine
    engine.reset(0)
    engine.prefill(0, ids, _core.Sampling(), "none")
    return engine


def test_hidden_states_are_the_target_layers_outputs(model, target):
    """The captured rows of a prompt against the float64 numpy model's residual stream after
    each target layer (HF hidden_states[id + 1])."""
    ck = load_checkpoint(target)
    ids = prompt(ck.config.vocab_size, 40, seed=5)
    engine = _prefill(model, ids)
    got = engine.dflash_hidden(len(ids))
    ref = mf.numpy_model(ck)
    x, want = ref.embed[np.asarray(ids)], []
    for i, kind in enumerate(ck.config.layer_types):
        x = ref.layer(ck.layer_prefix(i), kind, x)
        if i in TARGET_LAYERS:
            want.append(x)
    want = np.concatenate([want[TARGET_LAYERS.index(i)] for i in TARGET_LAYERS], axis=1)
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-3, f"captured hidden states differ by {err:.3g} (relative)"


# 7: the most of the small matvec tier (8 rows); 15: a published 16-row block (the deep tier)
@pytest.mark.parametrize("k", [1, 3, 7, DRAFTS])
def test_block_logits_equal_the_reference_drafters(model, target, drafter, k):
    """Given the same target hidden states (the engine's capture of the prompt), the drafter's block
    logits equal mlx-vlm's DFlashDraftModel's in float32 (the same block length), and so do their
    argmaxes, the drafts, wherever the reference's margin is clear of the error."""
    import mlx.core as mx

    ids = prompt(model.config.vocab_size, 33, seed=k)
    engine = _prefill(model, ids)
    hidden = engine.dflash_hidden(len(ids))
    chosen = engine.chosen(0)
    got = engine.dflash_block(0, k)
    assert engine.tokens(0) == ids  # drafted, not fed
    ref = df.load_reference(drafter, target)
    block = mx.array([[chosen] + [ref.config.mask_token_id] * k], dtype=mx.int32)
    want = np.array(ref(block, mx.array(hidden)[None], ref.make_cache())[0, 1:].astype(mx.float32))
    assert_logits_close(got, want, 1e-3)


def test_verified_rows_extend_the_context(model, target, drafter):
    """After verify rounds (their rows projected on the matvec path, rejected drafts' rows left
    stale), the block sees exactly the committed rows' hidden states as context."""
    import mlx.core as mx

    ids = prompt(model.config.vocab_size, 21, seed=7)
    engine = _prefill(model, ids)
    rows = [engine.dflash_hidden(len(ids))]
    for k in (3, 1, DRAFTS, 2):
        out = engine.verify_dflash(0, k, _core.Sampling())
        rows.append(engine.dflash_hidden(k + 1)[: len(out)])  # the fed token's row and the accepted drafts'
    hidden = np.concatenate(rows)
    assert len(hidden) == engine.position(0)
    got = engine.dflash_block(0, 5)
    ref = df.load_reference(drafter, target)
    block = mx.array([[engine.chosen(0)] + [ref.config.mask_token_id] * 5], dtype=mx.int32)
    want = np.array(ref(block, mx.array(hidden)[None], ref.make_cache())[0, 1:].astype(mx.float32))
    assert_logits_close(got, want, 1e-3)


def test_accepted_drafts_extend_the_context_at_every_depth(model, target, drafter):
    """Drafts right for j tokens then wrong (host drafts from plain decoding's tokens), j at each edge of
    the two matvec tiers (every j is test_speculative's):
    each step's accepted rows (and only those) become context, as the reference sees it."""
    import mlx.core as mx

    ids = prompt(model.config.vocab_size, 19, seed=8)
    engine = _prefill(model, ids)
    engine.decode_begin(0, 80, _core.Sampling())
    plain = [engine.decode_next() for _ in range(80)]
    engine.decode_end()
    engine = _prefill(model, ids)
    rows, at = [engine.dflash_hidden(len(ids))], 0  # plain[at]: the token chosen at the slot's position
    for right in (0, 1, 2, 6, 7, 8, 14, DRAFTS):
        k = min(DRAFTS, right + 1)
        drafts = plain[at + 1: at + 1 + k]
        if right < k:
            drafts[right] = (drafts[right] + 1) % model.config.vocab_size
        out = engine.verify(0, drafts, _core.Sampling())
        assert out == plain[at + 1: at + 1 + len(out)] and len(out) == right + 1
        rows.append(engine.dflash_hidden(k + 1)[: len(out)])
        at += len(out)
    hidden = np.concatenate(rows)
    assert len(hidden) == engine.position(0)
    got = engine.dflash_block(0, 6)
    ref = df.load_reference(drafter, target)
    block = mx.array([[engine.chosen(0)] + [ref.config.mask_token_id] * 6], dtype=mx.int32)
    want = np.array(ref(block, mx.array(hidden)[None], ref.make_cache())[0, 1:].astype(mx.float32))
    assert_logits_close(got, want, 1e-3)


def test_snapshots_keep_the_drafters_context(model):
    """A prefix-cache snapshot holds the drafter's context rows: restored over another sequence,
    the block gives the bits it gave right after the prompt."""
    ids = prompt(model.config.vocab_size, 30, seed=4)
    engine = model._engine
    engine.reset(0)
    snaps = []
    engine.prefill(0, ids, _core.Sampling(), "none", snapshot_at=[len(ids)], snapshots=snaps)
    chosen = engine.chosen(0)
    want = engine.dflash_block(0, 4)
    _prefill(model, prompt(model.config.vocab_size, 40, seed=99))  # other context rows over the same positions
    engine.restore(0, snaps[0])
    engine.set_chosen(0, chosen)
    np.testing.assert_array_equal(engine.dflash_block(0, 4), want)


def test_verify_rounds_give_plain_decodings_tokens(model):
    """verify_dflash rounds (draft + verify + accept + rollback + context update, one command
    buffer each) at every depth give exactly plain greedy decoding's tokens."""
    ids = prompt(model.config.vocab_size, 24, seed=11)
    engine = _prefill(model, ids)
    engine.decode_begin(0, 61, _core.Sampling())
    plain = [engine.decode_next() for _ in range(61)]  # the first: the token prefill chose
    engine.decode_end()
    engine = _prefill(model, ids)
    before = engine.counters()
    got = [engine.chosen(0)]
    depths = [1, 2, 3, DRAFTS]
    steps = 0
    while len(got) < len(plain):
        got += engine.verify_dflash(0, depths[steps % len(depths)], _core.Sampling())
        steps += 1
    c = engine.counters()
    assert got[: len(plain)] == plain
    assert c["verify_steps"] - before["verify_steps"] == steps
    assert c["drafted"] - before["drafted"] == sum(depths[i % len(depths)] for i in range(steps))


def test_moe_target_with_the_q8_cache_decodes_exactly(converted, device, tmp_path):
    """A MoE target, q8 KV cache, a context past the attention split (128 positions): verify_dflash
    rounds give plain greedy decoding's tokens."""
    _, target = converted("moe")
    cfg = load_checkpoint(target).config
    folder = df.write_drafter(tmp_path / "drafter", df.drafter_config(cfg, target_layer_ids=(0, 3), heads=2,
                                                                      kv_heads=1, head_dim=256), seed=5)
    model = metalqwen.load(target, device=device, max_context=CONTEXT, kv_bits=8, progress=False, draft=folder)
    ids = prompt(cfg.vocab_size, 120, seed=6)
    engine = _prefill(model, ids)
    engine.decode_begin(0, 40, _core.Sampling())
    plain = [engine.decode_next() for _ in range(40)]
    engine.decode_end()
    engine = _prefill(model, ids)
    got = [engine.chosen(0)]
    while len(got) < len(plain):
        got += engine.verify_dflash(0, DRAFTS, _core.Sampling())
    assert got[: len(plain)] == plain


def test_generate_with_dflash_equals_plain(model):
    ids = prompt(model.config.vocab_size, 20, seed=2)
    plain = model.generate(ids, max_tokens=48, temperature=0.0, speculative="off")
    spec = model.generate(ids, max_tokens=48, temperature=0.0)
    assert spec.tokens == plain.tokens
    assert model.counters()["verify_steps"] > 0
    sampled = model.generate(ids, max_tokens=24, temperature=0.8, seed=3)  # point-mass drafts: the sampler's rule
    assert len(sampled.tokens) == 24 or sampled.finish_reason == "stop"


# ---------------------------------------------------------------------------- the depth policy


def untimed_policy() -> spec.DepthPolicy:
    """The policy spec.generate gets for DFlash, deciding from acceptance alone (wall times ignored):
    deterministic."""
    policy = spec.policy_for(spec.DflashBlock(), DRAFTS)
    policy.observe_verify = policy.observe_plain = lambda *timing: None
    return policy


class HostRounds:
    """The engine, with each DFlash round's drafts given by the host: plain decoding's continuation,
    made wrong at its first draft when ``right`` is False. Records the drafts asked per round."""

    def __init__(self, model, plain: list[int], prompt_len: int, right: bool):
        self.engine, self.vocab = model._engine, model.config.vocab_size
        self.plain, self.prompt_len, self.right, self.asked = plain, prompt_len, right, []

    def verify_dflash(self, slot: int, k: int, sampling):
        self.asked.append(k)
        at = self.engine.position(slot) - self.prompt_len  # plain[at]: the token chosen last
        drafts = list(self.plain[at + 1: at + 1 + k])
        if not self.right:
            drafts[0] = (drafts[0] + 1) % self.vocab
        return self.engine.verify(slot, drafts, sampling)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _plain(model, ids, n):
    engine = _prefill(model, ids)
    engine.decode_begin(0, n, _core.Sampling())
    plain = [engine.decode_next() for _ in range(n)]
    engine.decode_end()
    return plain


def _rounds(model, ids, n, engine):
    _prefill(model, ids)
    return list(spec.generate(engine, 0, model._engine.chosen(0), n, _core.Sampling(), spec.DflashBlock(),
                              untimed_policy(), list(ids)))


def test_policy_grows_the_block_while_drafts_are_right(model):
    """Rounds whose drafts are all right: the block grows (untried depths expected to be accepted
    as the deepest tried one is) to the whole block, 15 drafts, and never shrinks until the
    budget's end; the tokens are plain decoding's."""
    ids = prompt(model.config.vocab_size, 20, seed=12)
    plain = _plain(model, ids, 110)
    rounds = HostRounds(model, plain + [0] * 16, len(ids), right=True)
    assert _rounds(model, ids, 110, rounds) == plain
    asked = rounds.asked
    assert asked[:-1] == sorted(asked[:-1]) and asked[-2] == DRAFTS and len(asked) <= 10, asked


def test_policy_stops_drafting_when_drafts_are_wrong(model):
    """Rounds whose first draft is always wrong: within three rounds the block is one draft, and
    the policy soon decodes plainly, probing with one-draft blocks after pauses; the tokens are
    plain decoding's. With the test drafter (random weights: next to nothing accepted) likewise."""
    ids = prompt(model.config.vocab_size, 20, seed=13)
    plain = _plain(model, ids, 120)
    rounds = HostRounds(model, plain + [0] * 16, len(ids), right=False)
    assert _rounds(model, ids, 120, rounds) == plain
    asked = rounds.asked
    assert asked[0] > asked[1] > asked[2] == 1 and set(asked[2:]) == {1} and len(asked) <= 12, asked

    before = model.counters()["verify_steps"]
    assert _rounds(model, ids, 120, model._engine) == plain
    assert model.counters()["verify_steps"] - before <= 12


def test_policy_scales_untimed_block_lengths_by_timed_rounds():
    """With a block drafter one timed round prices every block length: rounds dearer than modelled
    at one depth make every depth dearer, so where no block length beats a plain step the policy
    stops drafting (a long context, a slow GPU) even with every draft accepted."""
    policy = spec.policy_for(spec.DflashBlock(), DRAFTS)
    assert policy.block and not spec.policy_for(spec.MtpHead(), 3).block
    for _ in range(20):
        policy.update(DRAFTS, DRAFTS)
    assert policy.depth() == DRAFTS
    policy.observe_plain(1, 0.010)
    policy.observe_verify(DRAFTS, 0.010 * 20 * policy.modelled_cost(DRAFTS))  # 20x dearer than modelled
    assert policy.cost(DRAFTS) == pytest.approx(20 * policy.modelled_cost(DRAFTS))
    assert policy.cost(3) == pytest.approx(20 * policy.modelled_cost(3))
    assert policy.depth() == 0
    mtp = spec.DepthPolicy(3)  # the MTP head's policy: an untimed depth stays modelled
    mtp.observe_plain(1, 0.010)
    mtp.observe_verify(3, 0.1)
    assert mtp.cost(1) == mtp.modelled_cost(1) and mtp.cost(3) == pytest.approx(10)


def test_sampled_rounds_verify_the_blocks_drafts_by_the_point_mass_rule(model):
    """A sampled DFlash round (15 drafts, the deep tier) chooses exactly what a verify step of the
    same drafts given by the host chooses for the same seed: the block's drafts are the drafter's
    argmaxes, point masses independent of the sampler's draws, verified by the rule whose
    distribution test_speculative checks at every row of a 16-row step. Seeds that choose
    differently (temperature 1, top-k 4) show that the comparison is not of one fixed answer."""
    ids = prompt(model.config.vocab_size, 26, seed=14)
    engine = model._engine
    engine.reset(0)
    snapshots = []
    engine.prefill(0, ids, _core.Sampling(), "none", snapshot_at=[len(ids)], snapshots=snapshots)
    drafts = [int(t) for t in np.argmax(engine.dflash_block(0, DRAFTS), axis=1)]
    outs = set()
    for seed in range(4):
        sampling = _core.Sampling(temperature=1.0, top_k=4, seed=seed)
        engine.restore(0, snapshots[0])
        got = engine.verify_dflash(0, DRAFTS, sampling)
        engine.restore(0, snapshots[0])
        assert got == engine.verify(0, drafts, sampling), f"seed {seed}"
        outs.add(tuple(got))
    assert len(outs) > 1, outs
