"""The MTP head: loading it from every place folders keep it, in either norm convention, and
Model.mtp_logits against a float64 numpy reference of the head's math (csrc/engine/mtp.h).

Dense: the tiny original "wide_untied_g32" (random MTP weights) converted by `metalqwen convert`.
MoE: mlx-lm's "moe" conversion with a sidecar head grafted on (its layer the trunk's attention
layer 3 as converted, so quantized like the trunk; fc and norms random)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import metalqwen
from metalqwen.checkpoint import load_checkpoint, read_safetensors_header, tensor_view
from metalqwen.convert import add_mtp, convert
from metalqwen.demo_checkpoint import bf16_bits, bf16_to_f32, quantize_affine, write_safetensors

from ..support import model_fixtures as mf
from ..support.model_checks import assert_logits_close, logit_tolerance, prompt

# Prompt length and prefill chunk: the first chunk's 16 rows take the head through the GEMM and
# prefill-attention path, the last 3 (the last id has no next) through the matvec / flash-decode one.
IDS, CHUNK = 20, 16


@pytest.fixture(scope="module")
def dense(converted, tmp_path_factory):
    hf, _ = converted("wide_untied_g32")
    return convert(hf, tmp_path_factory.mktemp("mtp") / "dense", bits=4, group_size=32)


@pytest.fixture(scope="module")
def moe(converted, tmp_path_factory):
    """mlx-lm's MoE folder plus mtp.safetensors (not in its index)."""
    _, mlx = converted("moe")
    folder = shutil.copytree(mlx, tmp_path_factory.mktemp("mtp") / "moe")
    ck = load_checkpoint(folder)
    H, rng = ck.config.hidden_size, np.random.default_rng(7)
    layer = next(i for i, k in enumerate(ck.config.layer_types) if k == "full_attention")
    prefix = ck.layer_prefix(layer)
    head = {"mtp.layers.0." + n[len(prefix):]: (t.dtype, np.array(ck.array(n)))
            for n, t in ck.tensors.items() if n.startswith(prefix)}
    wq, scales, biases = quantize_affine(rng.standard_normal((H, 2 * H), dtype=np.float32) / np.sqrt(2 * H), 4, 64)
    head.update({"mtp.fc.weight": ("U32", wq), "mtp.fc.scales": ("BF16", scales), "mtp.fc.biases": ("BF16", biases)})
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        head[f"mtp.{norm}.weight"] = ("BF16", bf16_bits(1 + 0.1 * rng.standard_normal(H, dtype=np.float32)))
    write_safetensors(os.path.join(folder, "mtp.safetensors"), head)
    return os.fspath(folder)


_loaded: dict = {}


def loaded(path, device, kv_bits=16, **options) -> metalqwen.Model:
    options = {"mtp": True, **options}  # the head, without speculation
    key = (device.kind, os.fspath(path), kv_bits, tuple(sorted(options.items())))
    if key not in _loaded:
        _loaded[key] = metalqwen.load(path, device=device, max_context=48, kv_bits=kv_bits, prefill_chunk=CHUNK,
                                      progress=False, **options)
    return _loaded[key]


def reference_mtp_logits(path, ids, pre_norm=False, embedding_first=True) -> np.ndarray:
    """Row t: lm_head(mtp.norm(layer(fc([rms(embed(ids[t+1])) * w_e | rms(h[t]) * w_h])))) at position t."""
    m = mf.numpy_model(load_checkpoint(path))
    h = m.hidden(ids, pre_norm)[:-1]
    e = m.rms(m.embed[np.asarray(ids[1:])], m.f("mtp.pre_fc_norm_embedding.weight"))
    g = m.rms(h, m.f("mtp.pre_fc_norm_hidden.weight"))
    u = m.linear("mtp.fc", np.concatenate([e, g] if embedding_first else [g, e], axis=-1))
    x = m.layer("mtp.layers.0.", "full_attention", u)
    return m.logits(m.rms(x, m.f("mtp.norm.weight")))


def mtp_tolerance(config, kv_bits: int) -> float:
    """test_model's logit tolerance; for q8, the MTP layer counts as one more attention layer."""
    if kv_bits == 16:
        return logit_tolerance(config, 16)
    return 1.5 * (sum(t == "full_attention" for t in config.layer_types) + 1) / 254


def _check_against_reference(path, got, ids, kv_bits, pre_norm=False):
    config = load_checkpoint(path).config
    want = reference_mtp_logits(path, ids, pre_norm)
    tolerance = mtp_tolerance(config, kv_bits)
    assert_logits_close(got, want, tolerance)
    # The comparison can fail: the other concat order or the other hidden state lies beyond it.
    scale = np.abs(want).max()
    for wrong in (reference_mtp_logits(path, ids, pre_norm, embedding_first=False),
                  reference_mtp_logits(path, ids, not pre_norm)):
        assert np.abs(got - wrong).max() / scale > 2 * tolerance


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_dense_mtp_logits_match_the_reference(dense, device, kv_bits):
    ids = prompt(load_checkpoint(dense).config.vocab_size, IDS, seed=3)
    got = loaded(dense, device, kv_bits).mtp_logits(ids)
    assert got.shape == (IDS - 1, load_checkpoint(dense).config.vocab_size) and got.dtype == np.float32
    _check_against_reference(dense, got, ids, kv_bits)


def test_moe_mtp_logits_match_the_reference(moe, device):
    ids = prompt(load_checkpoint(moe).config.vocab_size, IDS, seed=4)
    _check_against_reference(moe, loaded(moe, device).mtp_logits(ids), ids, 16)


def test_the_pre_norm_hidden_option(dense, device):
    ids = prompt(load_checkpoint(dense).config.vocab_size, 6, seed=5)
    got = loaded(dense, device, mtp_hidden="pre_norm").mtp_logits(ids)
    _check_against_reference(dense, got, ids, 16, pre_norm=True)


def test_the_head_leaves_the_trunk_alone(dense, device):
    """Prefill with the head on fills its cache too: the trunk's logits and greedy tokens stay the same."""
    ids = prompt(load_checkpoint(dense).config.vocab_size, IDS, seed=6)
    on, off = loaded(dense, device), loaded(dense, device, mtp=False)
    assert on._engine.has_mtp and not off._engine.has_mtp
    assert np.array_equal(on.score(ids), off.score(ids))
    assert on.generate(ids, max_tokens=4).tokens == off.generate(ids, max_tokens=4).tokens
    # Admitted with the head's weights and its K/V cache (f16: 2 bytes x max_context x kv dim, twice);
    # a plain decode step does not stream the head.
    c, ck = on.counters(), load_checkpoint(dense)
    kv = 2 * 48 * ck.config.num_key_value_heads * ck.config.head_dim * 2
    assert c["memory_estimate"] - off.counters()["memory_estimate"] >= on.mtp_bytes + kv
    assert on.mtp_bytes == sum(t.nbytes for t in ck.mtp.values()) > 0 and off.mtp_bytes == 0
    assert c["weight_bytes_per_token"] == off.counters()["weight_bytes_per_token"]


# ---------------------------------------------------------------------------- where heads live


def _rename_mtp(folder, prefix):
    """Renames the folder's mtp.* tensors to prefix + rest, in the shards and the index."""
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index) as f:
        meta = json.load(f)
    def rename(names: dict) -> None:  # in place
        for k in [k for k in names if k.startswith("mtp.")]:
            names[prefix + k[4:]] = names.pop(k)

    for shard in sorted(set(meta["weight_map"].values())):
        mf.rewrite_header(os.path.join(folder, shard), rename)
    rename(meta["weight_map"])
    with open(index, "w") as f:
        json.dump(meta, f)


def _norm_tensors(folder, names):
    """name -> (file, TensorInfo) of the MTP norms among the folder's shards."""
    out = {}
    for shard in os.listdir(folder):
        if shard.endswith(".safetensors"):
            found, _ = read_safetensors_header(os.path.join(folder, shard))
            out.update({n: t for n, t in found.items() if n in names})
    return out


def _add_to_norms(folder, names, delta):
    """Stores each named bf16 norm as bf16(value + delta), in place."""
    for name, t in _norm_tensors(folder, names).items():
        values = bf16_to_f32(np.array(tensor_view(t)))
        data = np.memmap(t.file, dtype=np.uint16, mode="r+", offset=t.offset, shape=t.shape)
        data[:] = bf16_bits(values + np.float32(delta))
        data.flush()


MTP_NORMS = ["mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
             "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight",
             "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.self_attn.k_norm.weight"]


def test_prefixed_names_and_the_sidecar_load_the_same_head(dense, converted, tmp_path, device):
    want = load_checkpoint(dense).describe()["mtp"]
    for prefix in ("language_model.mtp.", "language_model.model.mtp."):
        folder = shutil.copytree(dense, tmp_path / prefix.replace(".", "_"))
        _rename_mtp(folder, prefix)
        got = load_checkpoint(folder).describe()["mtp"]
        assert sorted(got) == sorted(want)
        assert all(got[n][2:] == want[n][2:] for n in want)  # same sizes, dtypes, shapes, quantization
    hf, reference = converted("wide_untied_g32")
    side = shutil.copytree(reference, tmp_path / "sidecar")
    add_mtp(hf, side)
    assert sorted(load_checkpoint(side).mtp) == sorted(want)
    ids = prompt(load_checkpoint(dense).config.vocab_size, 6, seed=8)
    assert np.array_equal(loaded(side, device).mtp_logits(ids), loaded(dense, device).mtp_logits(ids))


def test_unshifted_mtp_norms_are_shifted_at_load(dense, tmp_path, device):
    raw = shutil.copytree(dense, tmp_path / "raw")
    _add_to_norms(raw, MTP_NORMS, -1.0)  # exact in bf16: stored 1 + w is a multiple of 2^-8 near 1
    ck = load_checkpoint(raw)
    assert {n for n, t in ck.mtp.items() if t.add == 1.0} == set(MTP_NORMS)
    assert not any(t.add for t in load_checkpoint(dense).mtp.values())
    ids = prompt(ck.config.vocab_size, 6, seed=9)
    got, want = loaded(raw, device).mtp_logits(ids), loaded(dense, device).mtp_logits(ids)
    assert np.array_equal(got, want)  # w + 1 in f32 is the stored bf16 1 + w exactly


def test_each_norm_group_is_judged_on_its_own(dense, tmp_path):
    """A bundle with the layer's norms (and so pre_fc_norm_*) raw but mtp.norm shifted (omlx PR #1507)."""
    mixed = shutil.copytree(dense, tmp_path / "mixed")
    _add_to_norms(mixed, [n for n in MTP_NORMS if n != "mtp.norm.weight"], -1.0)
    ck = load_checkpoint(mixed)
    assert {n for n, t in ck.mtp.items() if t.add == 1.0} == set(MTP_NORMS) - {"mtp.norm.weight"}


def test_double_shifted_mtp_norms_are_refused_naming_the_tensor(dense, tmp_path):
    twice = shutil.copytree(dense, tmp_path / "twice")
    _add_to_norms(twice, MTP_NORMS, 1.0)
    with pytest.raises(metalqwen.CheckpointError, match=r"tensor mtp\.layers\.0\..*shifted twice"):
        load_checkpoint(twice)


def test_a_folder_without_a_head_says_how_to_get_one(converted, device):
    _, plain = converted("wide_untied_g32")  # mlx_lm.convert drops mtp.*
    model = loaded(plain, device, mtp=None)
    with pytest.raises(metalqwen.CheckpointError, match="no MTP head.*metalqwen convert.*metalqwen add-mtp"):
        model.mtp_logits([1, 2, 3])
    with pytest.raises(metalqwen.CheckpointError, match="mtp=True.*no MTP head"):
        metalqwen.load(plain, device=device, max_context=16, progress=False, mtp=True)


def test_more_than_one_mtp_layer_is_refused(dense, tmp_path):
    folder = shutil.copytree(dense, tmp_path / "two")
    mf.edit_json(os.path.join(folder, "config.json"), lambda c: c["text_config"].update(mtp_num_hidden_layers=2))
    with pytest.raises(metalqwen.CheckpointError, match="mtp_num_hidden_layers = 2"):
        load_checkpoint(folder)
