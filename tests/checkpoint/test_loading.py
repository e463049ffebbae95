"""Loading: config parsing, checkpoint validation, the demo writer, tokenizer and chat template.

Real MLX folders come from mlx-lm's own converter run on tiny Hugging Face-format
checkpoints (model_fixtures.py), built once per session; bad-input tests damage private
copies of them and check that each problem raises a clear error naming the file, the
tensor or the field.
"""

from __future__ import annotations

import json
import os
import struct
import warnings

import numpy as np
import pytest

from metalqwen.checkpoint import CheckpointError, load_checkpoint, read_safetensors_header
from metalqwen.config import FP_MODES, ConfigError, ModelConfig, check_supported
from metalqwen.demo_checkpoint import (
    bf16_bits,
    bf16_to_f32,
    dequantize_affine,
    quantize_affine,
    write_demo_checkpoint,
)
from metalqwen.tokenizer import StopMatcher, StreamDecoder, Tokenizer, TokenizerError, find_stop

from ..support import model_fixtures as mf
from ..support.require import require

# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def damaged(converted, tmp_path):
    """damaged(name="base") -> a private copy of a converted MLX folder to break."""
    return lambda name="base": mf.copy_checkpoint(converted(name)[1], tmp_path / f"{name}-copy")


def _text_config(**over):
    tc = mf.text_config(mf.DEMO_DIMS, tied=True, eos=7)
    tc.update(over)
    return tc


def _nested(**over):
    return {"model_type": "qwen3_5", "text_config": _text_config(**over)}


def _flat(**over):
    return {**_text_config(**over), "model_type": "qwen3_5"}


def _shard(folder):
    return os.path.join(folder, "model.safetensors")


def _plain(obj) -> bool:
    """True when obj is built only from the types a C++ binding reads without Python objects."""
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_plain(v) for v in obj)
    return obj is None or type(obj) in (str, int, float, bool)


# ---------------------------------------------------------------------------- config.json


def test_config_nested_and_flat_agree():
    nested = ModelConfig.from_dict(_nested())
    flat = ModelConfig.from_dict(_flat())
    assert nested.dims() == flat.dims()
    d = nested.dims()
    assert (d["hidden_size"], d["head_dim"], d["rotary_dim"], d["linear_conv_dim"]) == (512, 256, 64, 1024)
    assert d["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert d["rope_theta"] == 1e7 and d["partial_rotary_factor"] == 0.25
    check_supported(nested)


def test_config_layer_types_list_wins_over_interval():
    types = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
    c = ModelConfig.from_dict(_nested(layer_types=types, full_attention_interval=4))
    assert c.layer_types == tuple(types)


@pytest.mark.parametrize("interval, want", [(4, "LLLF"), (2, "LFLF"), (None, "LLLF")])
def test_config_interval_without_layer_types(interval, want):
    tc = _text_config()
    del tc["layer_types"], tc["full_attention_interval"]
    if interval is not None:
        tc["full_attention_interval"] = interval
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": tc})
    assert "".join("F" if t == "full_attention" else "L" for t in c.layer_types) == want


@pytest.mark.parametrize("types", [["linear_attention"] * 3, ["linear_attention"] * 3 + ["sliding_attention"], "LLLF"])
def test_config_bad_layer_types(types):
    with pytest.raises(ConfigError, match="layer_types"):
        ModelConfig.from_dict(_nested(layer_types=types))


def test_config_rope_flat_nested_and_rope_scaling():
    flat = _text_config()
    del flat["rope_parameters"]
    flat.update(rope_theta=5e6, partial_rotary_factor=0.5)
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": flat})
    assert (c.rope_theta, c.partial_rotary_factor, c.rotary_dim, c.rope_type) == (5e6, 0.5, 128, "default")

    both = dict(flat, rope_parameters={"rope_type": "default", "rope_theta": 1e6})  # nested wins, flat factor stays
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": both})
    assert (c.rope_theta, c.partial_rotary_factor) == (1e6, 0.5)

    legacy = dict(flat, rope_scaling={"type": "yarn", "factor": 4.0})
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": legacy})
    assert c.rope_type == "yarn" and c.rope_theta == 5e6
    with pytest.raises(ConfigError, match="rope_type.*'yarn'"):
        check_supported(c)

    bare = dict(flat)
    del bare["rope_theta"], bare["partial_rotary_factor"]
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": bare})
    assert c.partial_rotary_factor == 0.25  # the Qwen3.5 default


def test_config_quantization_overrides():
    raw = _nested()
    raw["quantization"] = {
        "group_size": 64, "bits": 4, "mode": "affine",
        "language_model.model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
        "language_model.model.layers.1.linear_attn.in_proj_a": False,
    }
    c = ModelConfig.from_dict(raw)
    assert c.quant_for("language_model.model.layers.0.mlp.gate_proj") == (4, 64, "affine")
    assert c.quant_for("language_model.model.layers.0.mlp.down_proj") == (8, 32, None)  # mode not written
    assert c.quant_for("language_model.model.layers.1.linear_attn.in_proj_a") is None
    assert c.quant_for("language_model.model.layers.2.mlp.up_proj", in_features=100) is None  # not a group multiple
    assert ModelConfig.from_dict(_nested()).quant_for("language_model.lm_head") is None  # unquantized folder
    raw["quantization"]["vision_tower.blocks.0.attn.qkv"] = {"group_size": 64, "bits": 6}  # never used: no error
    assert ModelConfig.from_dict(raw).quant_for("vision_tower.blocks.0.attn.qkv") == (4, 64, "affine")
    raw["quantization"] = {"group_size": 32, "bits": 4, "mode": "mxfp4",
                           "language_model.model.layers.0.mlp.down_proj": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}
    c = ModelConfig.from_dict(raw)
    assert c.quant_for("language_model.model.layers.0.mlp.gate_proj") == (4, 32, "mxfp4")
    assert c.quant_for("language_model.model.layers.0.mlp.down_proj") == (4, 16, "nvfp4")


@pytest.mark.parametrize("quant, match", [
    ({"group_size": 64, "bits": 7}, "bits = 7 for the folder default"),
    ({"group_size": 16, "bits": 4, "mode": "affine"}, "group_size = 16 for the folder default"),
    ({"group_size": 64, "bits": 4, "language_model.model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 1}},
     r"bits = 1 for language_model\.model\.layers\.0\.mlp\.down_proj"),
    ({"group_size": 64, "bits": 4, "language_model.lm_head": {"group_size": 16, "bits": 4, "mode": "affine"}},
     r"group_size = 16 for language_model\.lm_head"),
    ({"group_size": 32, "bits": 4, "mode": "nvfp4"}, "mode 'nvfp4' .* nvfp4 is 4-bit with group size 16"),
    ({"group_size": 32, "bits": 8, "mode": "fp8"}, "mode 'fp8' .* not supported"),
])
def test_config_unsupported_quantization(quant, match):
    raw = _nested()
    raw["quantization"] = quant
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(raw)


def test_config_eos_ids_from_config_and_generation_config():
    assert ModelConfig.from_dict(_nested()).eos_token_ids == (7,)
    assert ModelConfig.from_dict(_nested(eos_token_id=[7, 9])).eos_token_ids == (7, 9)
    c = ModelConfig.from_dict(_nested(), generation_config={"eos_token_id": [11, 7]})
    assert c.eos_token_ids == (11, 7)
    c = ModelConfig.from_dict(_nested(), generation_config={"eos_token_id": 12})
    assert c.eos_token_ids == (12, 7)
    raw = _nested()
    raw["eos_token_id"] = [5, 7]  # mlx-lm's converter copies generation_config's ids to the top level
    assert ModelConfig.from_dict(raw).eos_token_ids == (5, 7)
    with pytest.raises(ConfigError, match="eos_token_id"):
        ModelConfig.from_dict(_nested(), generation_config={"eos_token_id": "x"})


def test_config_tie_word_embeddings_text_config_wins():
    raw = _nested(tie_word_embeddings=False)
    raw["tie_word_embeddings"] = True
    assert ModelConfig.from_dict(raw).tie_word_embeddings is False
    tc = _text_config()
    del tc["tie_word_embeddings"]
    assert ModelConfig.from_dict({"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": tc}
                                 ).tie_word_embeddings is True


@pytest.mark.parametrize("model_type", ["llama", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", None])
def test_config_unknown_model_type(model_type):
    raw = _flat()
    raw["model_type"] = model_type
    with pytest.raises(ConfigError, match=f"model_type {model_type!r}"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("field, value, match", [
    ("hidden_size", None, "required field text_config.hidden_size is missing"),
    ("hidden_size", "512", "text_config.hidden_size must be an integer"),
    ("num_hidden_layers", 0, "text_config.num_hidden_layers = 0 must be >= 1"),
    ("rms_norm_eps", -1, "text_config.rms_norm_eps must be a positive number"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings must be true or false"),
])
def test_config_bad_fields(field, value, match):
    raw = _nested()
    if value is None:
        del raw["text_config"][field]
    else:
        raw["text_config"][field] = value
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("field, value", [
    ("head_dim", 128), ("linear_key_head_dim", 64), ("linear_value_head_dim", 256),
    ("linear_conv_kernel_dim", 3), ("attention_bias", True), ("attn_output_gate", False),
])
def test_check_supported_names_the_field(field, value):
    c = ModelConfig.from_dict(_nested(**{field: value}))
    with pytest.raises(ConfigError, match=f"{field} = {value!r} is not supported"):
        check_supported(c)


_MOE = dict(model_type="qwen3_5_moe_text", num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
            shared_expert_intermediate_size=512)


def _moe(**over):
    tc = _text_config(**{**_MOE, **over})
    del tc["intermediate_size"]  # MoE configs have none
    return {"model_type": "qwen3_5_moe", "text_config": tc}


def test_moe_config_is_parsed():
    c = ModelConfig.from_dict(_moe())
    check_supported(c)
    assert c.is_moe and (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (256, 8, 512)
    assert c.shared_expert_intermediate_size == 512 and c.norm_topk_prob is True and c.intermediate_size == 0
    assert ModelConfig.from_dict(_moe(norm_topk_prob=False)).norm_topk_prob is False
    assert c.dims()["num_experts_per_tok"] == 8 and not ModelConfig.from_dict(_nested()).is_moe


@pytest.mark.parametrize("field, value, match", [
    ("num_experts_per_tok", None, "required field text_config.num_experts_per_tok is missing"),
    ("moe_intermediate_size", None, "required field text_config.moe_intermediate_size is missing"),
    ("shared_expert_intermediate_size", 0, "shared_expert_intermediate_size = 0 must be >= 1"),
    ("norm_topk_prob", 1, "norm_topk_prob must be true or false"),
])
def test_moe_config_bad_fields(field, value, match):
    raw = _moe(**({} if value is None else {field: value}))
    if value is None:
        del raw["text_config"][field]
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("field, value", [("num_experts", 513), ("num_experts_per_tok", 17),
                                          ("moe_intermediate_size", 510)])
def test_moe_check_supported_names_the_field(field, value):
    c = ModelConfig.from_dict(_moe(**{field: value}))
    with pytest.raises(ConfigError, match=f"{field} = {value!r} is not supported"):
        check_supported(c)


def test_config_missing_or_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ModelConfig.from_folder(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="config.json is missing"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_nested()))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3]}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (3, 7)


# ---------------------------------------------------------------------------- our writer's primitives


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_affine_is_bit_exact_with_mlx(bits, group):
    mx = require("mlx.core")
    rng = np.random.default_rng(bits * group)
    w = rng.standard_normal((48, 384)).astype(np.float32) * 0.05
    w[0, :group] = 0.25          # constant group
    w[1, :group] = -np.abs(w[1, :group])  # all-negative group: negative edge
    w[2, :group] = np.abs(w[2, :group])   # all-positive: negative scale
    w = bf16_to_f32(bf16_bits(w))
    wq, scales, biases = quantize_affine(w, bits, group)
    mq, ms, mb = mx.quantize(mx.array(w).astype(mx.bfloat16), group_size=group, bits=bits)
    assert np.array_equal(wq, np.array(mq))
    assert np.array_equal(scales, np.array(ms.view(mx.uint16)))
    assert np.array_equal(biases, np.array(mb.view(mx.uint16)))
    # Half a step per group, widened by the snapped scale and the bf16 rounding of scale and bias.
    err = np.abs(dequantize_affine(wq, scales, biases, bits, group) - w).reshape(48, -1, group).max(axis=-1)
    g = w.reshape(48, -1, group)
    step = (g.max(axis=-1) - g.min(axis=-1)) / (2**bits - 1)
    assert (err <= step + np.abs(g).max(axis=-1) * 2.0**-8 + 1e-7).all()


def test_demo_checkpoint_is_deterministic(tmp_path):
    a = write_demo_checkpoint(tmp_path / "a", seed=3, num_hidden_layers=2, full_attention_interval=2)
    b = write_demo_checkpoint(tmp_path / "b", seed=3, num_hidden_layers=2, full_attention_interval=2)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    with pytest.raises(FileExistsError):
        write_demo_checkpoint(a)
    assert load_checkpoint(b).config.layer_types == ("linear_attention", "full_attention")


# ---------------------------------------------------------------------------- the demo checkpoint


def test_demo_checkpoint_loads_and_describes(demo):
    ck = load_checkpoint(demo)
    c = ck.config
    assert (c.hidden_size, c.num_hidden_layers, c.head_dim, c.linear_key_head_dim, c.linear_value_head_dim) == \
        (512, 4, 256, 128, 128)
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert c.tie_word_embeddings and 1000 <= c.vocab_size <= 4000
    tok = Tokenizer.from_folder(demo)
    assert tok.vocab_size <= c.vocab_size and set(c.eos_token_ids) == {tok.eos_token_id, tok.token_to_id("<|endoftext|>")}

    d = ck.describe()
    assert _plain(d)
    assert d["dims"] == c.dims()
    assert [layer["type"] for layer in d["layers"]] == list(c.layer_types)
    assert "language_model.lm_head.weight" not in d["globals"]
    size = os.path.getsize(_shard(demo))
    n = 0
    for entries in [d["globals"]] + [layer["tensors"] for layer in d["layers"]]:
        for name, (file, offset, nbytes, dtype, shape, bits, group, mode) in entries.items():
            n += 1
            assert file == _shard(demo) and offset + nbytes <= size
            quantized = dtype == "U32" or name.endswith(("scales", "biases"))
            assert (bits, group, mode) == ((4, 64, "affine") if quantized else (None, None, None))
    assert n == len(ck.tensors) == len(d["tensors"])
    for layer in d["layers"]:  # the flat map and the per-layer view agree
        for rel, entry in layer["tensors"].items():
            assert d["tensors"][layer["prefix"] + rel] == entry
    attn = d["layers"][3]["tensors"]
    assert attn["self_attn.q_proj.weight"][3:5] == ("U32", (2 * 2 * 256, 512 * 4 // 32))
    lin = d["layers"][0]["tensors"]
    assert lin["linear_attn.conv1d.weight"][3:5] == ("BF16", (1024, 4, 1))
    assert lin["linear_attn.A_log"][3:5] == ("F32", (4,))
    assert d["layers"][0]["prefix"] == "language_model.model.layers.0."


def test_demo_checkpoint_runs_in_mlx_lm(demo):
    mx = require("mlx.core")
    import mlx_lm

    model, tokenizer = mlx_lm.load(demo)
    ck = load_checkpoint(demo)
    # mlx-lm reads exactly the bytes our loader points at.
    layer0 = model.language_model.model.layers[0]
    assert np.array_equal(np.array(layer0.mlp.gate_proj.weight),
                          ck.array("language_model.model.layers.0.mlp.gate_proj.weight"))
    assert np.array_equal(np.array(layer0.linear_attn.conv1d.weight.view(mx.uint16)),
                          ck.array("language_model.model.layers.0.linear_attn.conv1d.weight"))
    ids = tokenizer.encode("hello world")
    assert ids == Tokenizer.from_folder(demo).encode("hello world")
    logits = np.array(model(mx.array([ids])).astype(mx.float32))
    assert logits.shape == (1, len(ids), ck.config.vocab_size) and np.isfinite(logits).all()
    text = mlx_lm.generate(model, tokenizer, "hello", max_tokens=4, verbose=False)
    assert isinstance(text, str)


# ---------------------------------------------------------------------------- mlx_lm.convert outputs


@pytest.mark.parametrize("name", list(mf.VARIANTS))
def test_mlx_convert_output_validates(converted, name):
    mx = require("mlx.core")
    variant = mf.VARIANTS[name]
    hf, mlx = converted(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a real conversion has no unknown tensors
        ck = load_checkpoint(mlx)
    c = ck.config
    if not variant.quantize:
        assert c.quant_default is None
    elif variant.mode == "affine":
        assert c.quant_default == (variant.bits, variant.group_size, "affine")
    else:
        assert c.quant_default == (*FP_MODES[variant.mode], variant.mode)
    assert c.tie_word_embeddings == variant.tied
    assert ("language_model.lm_head.weight" in ck.tensors) == (not variant.tied)
    for module in ("language_model.model.embed_tokens", "language_model.lm_head"):
        if module + ".weight" in ck.tensors:  # as config.json says, mode resolved (affine when unwritten)
            want = c.quant_for(module)
            assert ck.quant(module) == (want and want._replace(mode=want.mode or "affine"))
    assert not ck.mtp and not ck.unknown  # the converter drops mtp.*
    k = variant.dims.get("full_attention_interval", 4)
    assert c.layer_types == tuple("full_attention" if (i + 1) % k == 0 else "linear_attention"
                                  for i in range(c.num_hidden_layers))
    a_log = ck.tensors["language_model.model.layers.0.linear_attn.A_log"]
    assert a_log.dtype == variant.a_log_dtype
    # Every tensor we locate is byte-identical to what mlx itself loads.
    theirs = {}
    for f in ck.files:
        theirs.update(mx.load(f.path))
    assert set(theirs) == set(ck.tensors)
    for n, t in ck.tensors.items():
        v = theirs[n]
        v = v.view(mx.uint16) if v.dtype == mx.bfloat16 else v
        assert np.array_equal(ck.array(n), np.array(v)), n
    # Norms are stored shifted (1 + w): the HF file holds w.
    hf_norm = mf.read_header(_shard(hf))["model.language_model.norm.weight"]
    assert hf_norm["shape"] == [c.hidden_size]
    norm = ck.array("language_model.model.norm.weight")
    norm = bf16_to_f32(norm) if ck.tensors["language_model.model.norm.weight"].dtype == "BF16" else norm
    assert 0.5 < norm.astype(np.float32).mean() < 1.5


def test_mixed_quantization_overrides(converted):
    ck = load_checkpoint(converted("mixed")[1])
    c = ck.config
    for i in range(c.num_hidden_layers):
        p = ck.layer_prefix(i)
        assert c.quant_for(p.removesuffix(".") + ".mlp.down_proj") == (8, 32, None)
        assert ck.quant(p + "mlp.down_proj") == (8, 32, "affine")
        assert ck.tensors[p + "mlp.down_proj.weight"].shape == (512, 1024 * 8 // 32)
        assert ck.quant(p + "mlp.up_proj") == (4, 64, "affine")
        if c.layer_types[i] == "linear_attention":
            # Left in bf16 by the predicate and not recorded in config.json: mlx-lm keeps it float too.
            assert ck.quant(p + "linear_attn.in_proj_a") is None
            assert ck.tensors[p + "linear_attn.in_proj_a.weight"].dtype == "BF16"
    entry = ck.describe()["layers"][0]["tensors"]["linear_attn.in_proj_a.weight"]
    assert entry[3:] == ("BF16", (4, 512), None, None, None)


def test_hf_folder_is_rejected_with_advice(converted):
    hf, _ = converted("base")
    with pytest.raises(CheckpointError, match="Hugging Face-format checkpoint.*mlx_lm.convert"):
        load_checkpoint(hf)


def test_print_one_conversion(converted, capsys):
    """Prints the tensor table of an mlx_lm.convert output (see with pytest -s)."""
    ck = load_checkpoint(converted("base")[1])
    with capsys.disabled():
        if os.environ.get("METALQWEN_PRINT_TENSORS"):
            for n, t in sorted(ck.tensors.items()):
                print(f"{n:66s} {t.dtype:4s} {list(t.shape)}")
    # per DeltaNet layer 11 (norms, MLP) + 15 (5 linears) + 4; per attention layer 11 + 12 + 2; embed 3, norm 1
    assert len(ck.tensors) == 3 * 30 + 1 * 25 + 4


# ---------------------------------------------------------------------------- mlx-lm references


def test_reference_logits_and_greedy_agree(converted):
    require("mlx.core")
    mlx = converted("base")[1]
    ids = Tokenizer.from_folder(mlx).encode("hello world, the model is tiny")
    ref = mf.reference_logits(mlx, ids)
    assert ref.dtype == np.float32 and ref.shape == (len(ids), 1024) and np.isfinite(ref).all()
    assert ref.std() > 0.3  # logits are spread: argmax is meaningful
    native = mf.reference_logits(mlx, ids, native=True)  # see reference_logits: not a reference on a CPU
    assert native.shape == ref.shape and np.isfinite(native).all()

    n = 6
    greedy = mf.reference_greedy(mlx, ids, n)
    full = mf.reference_logits(mlx, ids + greedy)
    # Cached token-by-token decoding picks what the full forward pass would.
    assert greedy == [int(np.argmax(full[len(ids) - 1 + j])) for j in range(n)]


@pytest.mark.parametrize("name", list(mf.VARIANTS) + ["demo"])
def test_numpy_forward_matches_mlx_lm_reference(converted, demo, name):
    """The model's math (docs/design.md, "The model"), run in numpy on our reading of the checkpoint, is mlx-lm's model.

    On the demo folder this also shows our writer's layout means to mlx-lm what we mean.
    """
    folder = demo if name == "demo" else converted(name)[1]
    ids = Tokenizer.from_folder(folder).encode("hello world, the tiny model says 你好 🚀")
    ref = mf.reference_logits(folder, ids)
    ours = mf.numpy_forward(load_checkpoint(folder), ids)
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4
    assert np.array_equal(ours.argmax(axis=1), ref.argmax(axis=1))


def test_reference_uses_exact_dequantized_weights(converted):
    require("mlx.core")
    mlx = converted("wide_untied_g32")[1]
    ck = load_checkpoint(mlx)
    model = mf._reference_model(mlx, False)
    p = "language_model.model.layers.1.self_attn.q_proj"
    ours = dequantize_affine(ck.array(p + ".weight"), ck.array(p + ".scales"), ck.array(p + ".biases"), 4, 32)
    theirs = np.array(model.language_model.model.layers[1].self_attn.q_proj.weight)
    assert theirs.dtype == np.float32 and np.array_equal(ours, theirs)


# ---------------------------------------------------------------------------- bad input: files and headers


def test_truncated_shard(damaged):
    folder = damaged()
    path = _shard(folder)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CheckpointError, match=f"{path}: tensor .*past the end of the {size - 1000}-byte file"):
        load_checkpoint(folder)
    with open(path, "r+b") as f:
        f.truncate(5)
    with pytest.raises(CheckpointError, match="truncated: 5 bytes"):
        load_checkpoint(folder)


def test_header_length_past_end_of_file(damaged):
    path = _shard(damaged())
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
    with pytest.raises(CheckpointError, match=f"{path}: corrupt or truncated header: header length"):
        read_safetensors_header(path)


def test_corrupt_header_json(damaged):
    folder = damaged()
    path = _shard(folder)
    with open(path, "r+b") as f:
        f.seek(8 + 40)
        f.write(b"\x00]]}")
    with pytest.raises(CheckpointError, match=f"{path}: corrupt header: not valid JSON"):
        load_checkpoint(folder)


@pytest.mark.parametrize("edit, match", [
    (lambda h: h["language_model.model.norm.weight"].update(data_offsets=[10, 2]), "out of order"),
    (lambda h: h["language_model.model.norm.weight"].update(dtype="Q4"), "unknown dtype 'Q4'"),
    (lambda h: h["language_model.model.norm.weight"].update(shape=[512, "x"]), "corrupt shape"),
    (lambda h: h["language_model.model.norm.weight"].update(shape=[513]), "hold 1024 bytes but BF16 \\[513\\] needs 1026"),
    (lambda h: h["language_model.model.norm.weight"].update(data_offsets=[1 << 40, (1 << 40) + 1024]), "past the end"),
    (lambda h: h.update({"x": [1, 2]}), "tensor x: corrupt header entry"),
])
def test_malformed_header_entries(damaged, edit, match):
    folder = damaged()
    mf.rewrite_header(_shard(folder), edit)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(folder)


def test_random_header_damage_never_crashes(damaged):
    """Seeded byte flips and truncations of a header: the load succeeds or raises CheckpointError, nothing else."""
    folder = damaged()
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    path = _shard(folder)
    with open(path, "rb") as f:
        original = f.read()
    (n,) = struct.unpack("<Q", original[:8])
    rng = np.random.default_rng(0)
    outcomes = {"loaded": 0, "rejected": 0}
    for trial in range(60):
        data = bytearray(original)
        if trial % 3 == 0:
            data = data[: int(rng.integers(0, 8 + n + 64))]
        else:
            for at in rng.integers(0, 8 + n, size=int(rng.integers(1, 4))):
                data[at] = int(rng.integers(0, 256))
        with open(path, "wb") as f:
            f.write(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_checkpoint(folder)
            outcomes["loaded"] += 1
        except CheckpointError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 30


def test_overlapping_tensors(damaged):
    folder = damaged()

    def overlap(h):
        a = h["language_model.model.layers.0.input_layernorm.weight"]
        b = h["language_model.model.layers.0.post_attention_layernorm.weight"]
        b["data_offsets"] = [a["data_offsets"][0] + 2, a["data_offsets"][1] + 2]

    mf.rewrite_header(_shard(folder), overlap)
    with pytest.raises(CheckpointError, match="layers.0.input_layernorm.weight and .*post_attention_layernorm.weight "
                                              "overlap|post_attention_layernorm.weight and .*input_layernorm.weight overlap"):
        load_checkpoint(folder)


def test_missing_tensor(damaged):
    folder = damaged()
    name = "language_model.model.layers.2.mlp.up_proj.scales"
    mf.rewrite_header(_shard(folder), lambda h: h.pop(name))
    # The index still lists it: that is caught first, naming file and tensor.
    with pytest.raises(CheckpointError, match=f"model.safetensors: tensor {name}: listed in .*index.json"):
        load_checkpoint(folder)
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    with pytest.raises(CheckpointError, match=f"tensor {name}: missing \\(the module's U32 weight is quantized\\)"):
        load_checkpoint(folder)


def test_missing_whole_module(damaged):
    folder = damaged()
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    prefix = "language_model.model.layers.3.self_attn.k_proj."
    mf.rewrite_header(_shard(folder), lambda h: [h.pop(prefix + s) for s in ("weight", "scales", "biases")])
    with pytest.raises(CheckpointError, match=f"tensor {prefix}weight: missing \\(expected U32 \\[256, 64\\] for 4-bit"):
        load_checkpoint(folder)


@pytest.mark.parametrize("name, change, match", [
    # same byte count, different shape: caught by the model check, not the header check
    ("language_model.model.layers.0.mlp.gate_proj.weight", {"shape": [16384, 4]},
     r"shape \[16384, 4\] with scales \[1024, 8\] does not quantize 512 input features"),
    ("language_model.model.layers.3.self_attn.q_norm.weight", {"shape": [16, 16]}, r"shape \[16, 16\], expected \[256\]"),
    ("language_model.model.layers.0.linear_attn.A_log", {"dtype": "I32"}, "dtype I32, expected F32 or BF16 or F16"),
    ("language_model.model.norm.weight", {"dtype": "I16"}, "dtype I16, expected BF16 or F16 or F32"),
    ("language_model.model.layers.0.linear_attn.conv1d.weight", {"shape": [1024, 1, 4]},
     r"shape \[1024, 1, 4\], expected \[1024, 4, 1\] \(this is the Hugging Face \[C, 1, K\] layout"),
])
def test_wrong_shape_or_dtype(damaged, name, change, match):
    folder = damaged()
    mf.rewrite_header(_shard(folder), lambda h: h[name].update(change))
    with pytest.raises(CheckpointError, match=f"{_shard(folder)}: tensor {name}: {match}"):
        load_checkpoint(folder)


def test_quantized_shapes_disagree_with_override(damaged):
    folder = damaged()
    module = "language_model.model.layers.0.mlp.up_proj"
    mf.edit_json(os.path.join(folder, "config.json"),
                 lambda c: c["quantization"].update({module: {"group_size": 64, "bits": 8}}))
    with pytest.raises(CheckpointError, match=f"tensor {module}.weight: shape \\[1024, 64\\], expected \\[1024, 128\\] "
                                              f"for 8-bit \\(config.json quantization"):
        load_checkpoint(folder)


def test_unsupported_quantization_inferred_from_shapes(damaged):
    """Modules config.json does not list are read as their shapes say (as mlx-lm does): still only the
    widths and group sizes the kernels have."""
    folder = damaged()
    module = "language_model.model.layers.1.mlp.gate_proj"
    # The same bytes read as [4096, 16] words: 16 words per row pack 512 inputs at 1 bit.
    mf.rewrite_header(_shard(folder), lambda h: h[module + ".weight"].update(shape=[4096, 16]))
    with pytest.raises(CheckpointError, match=f"tensor {module}.weight: 1-bit quantization is not supported"):
        load_checkpoint(folder)
    folder = damaged("mixed")  # a second copy; gate_proj is not listed in its config either
    mf.rewrite_header(_shard(folder), lambda h: h[module + ".scales"].update(shape=[256, 32]))
    with pytest.raises(CheckpointError, match=f"tensor {module}.scales: group size 16 is not supported"):
        load_checkpoint(folder)


def _without_quant_modes(config):
    """config.json as a converter that writes no "mode" would leave it."""
    for key in ("quantization", "quantization_config"):
        for value in [config[key]] + [v for v in config[key].values() if isinstance(v, dict)]:
            value.pop("mode", None)


def test_fp_scales_without_a_declared_mode_name_the_mode(damaged):
    folder = damaged("fp_modes")
    mf.edit_json(os.path.join(folder, "config.json"), _without_quant_modes)
    with pytest.raises(CheckpointError, match=r"embed_tokens\.scales: uint8 scales \(4-bit, group 32\) but "
                                              r"config\.json's quantization declares no mode.*add \"mode\": \"mxfp4\""):
        load_checkpoint(folder)


def test_fp_mode_with_biases_or_wrong_scale_dtype_is_refused(damaged):
    module = "language_model.model.layers.0.mlp.gate_proj"  # mxfp4: the folder default
    folder = damaged("fp_modes")
    mf.add_tensors(_shard(folder), {module + ".biases": ("BF16", (1024, 16), bytes(1024 * 16 * 2))})
    with pytest.raises(CheckpointError, match=f"tensor {module}.biases: present, but mxfp4 quantization has no biases"):
        load_checkpoint(folder)
    folder = damaged("base")
    mf.edit_json(os.path.join(folder, "config.json"), lambda c: c["quantization"].update(mode="mxfp4", group_size=32))
    with pytest.raises(CheckpointError, match=r"embed_tokens\.weight: shape .* is 4-bit with group 64, not the "
                                              r"folder's mxfp4"):
        load_checkpoint(folder)


@pytest.mark.parametrize("name, match", [
    # f16 scales are fine at group 64, but not next to bf16 biases: one kernel reads both
    ("language_model.model.embed_tokens.scales",
     r"embed_tokens\.biases: dtype BF16, but language_model\.model\.embed_tokens\.scales is F16"),
    ("language_model.model.layers.3.self_attn.k_norm.weight",
     r"k_norm\.weight: dtype F16, but language_model\.model\.layers\.3\.self_attn\.q_norm\.weight is BF16"),
])
def test_tensors_read_together_share_a_width(damaged, name, match):
    folder = damaged()
    mf.rewrite_header(_shard(folder), lambda h: h[name].update(dtype="F16"))
    with pytest.raises(CheckpointError, match=match + ": the kernels read these together"):
        load_checkpoint(folder)


def test_wide_scales_only_where_kernels_exist(damaged):
    """f16/f32 affine scales have kernels at group 64 only: group 32 ones are refused by name."""
    folder = damaged("wide_untied_g32")
    module = "language_model.model.layers.0.mlp.up_proj"
    mf.rewrite_header(_shard(folder), lambda h: [h[f"{module}.{p}"].update(dtype="F16") for p in ("scales", "biases")])
    with pytest.raises(CheckpointError, match=f"tensor {module}.scales: F16 scales with group 32: the kernels take "
                                              f"f16/f32 scales with group 64 only"):
        load_checkpoint(folder)


def test_f32_conv_weights_need_an_f32_a_log(damaged):
    folder = damaged("f16")
    d = "language_model.model.layers.0.linear_attn."
    def narrow(h):  # the first half of the f32 bytes, read as bf16
        begin = h[d + "A_log"]["data_offsets"][0]
        h[d + "A_log"].update(dtype="BF16", data_offsets=[begin, begin + 8])
    mf.rewrite_header(_shard(folder), narrow)
    with pytest.raises(CheckpointError, match=f"tensor {d}A_log: dtype BF16, but {d}conv1d.weight is F16"):
        load_checkpoint(folder)


def test_tied_config_with_lm_head_and_untied_without(converted, damaged):
    folder = damaged("wide_untied_g32")
    mf.edit_json(os.path.join(folder, "config.json"), lambda c: c["text_config"].update(tie_word_embeddings=True))
    with pytest.raises(CheckpointError, match="language_model.lm_head.*tie_word_embeddings = true"):
        load_checkpoint(folder)
    folder = damaged("base")
    mf.edit_json(os.path.join(folder, "config.json"), lambda c: c["text_config"].update(tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match="tensor language_model.lm_head.weight: missing"):
        load_checkpoint(folder)


def test_unknown_extra_tensors_warn_once_and_are_not_used(damaged):
    folder = damaged()
    os.remove(os.path.join(folder, "model.safetensors.index.json"))

    four = np.arange(4, dtype=np.float32).tobytes()
    mf.add_tensors(_shard(folder), {
        "language_model.model.extra_norm.weight": ("F32", [4], four),
        "model.visual.blocks.0.weight": ("F32", [4], four),   # recognised: ignored silently
    })
    with pytest.warns(UserWarning, match="ignoring 1 tensor.*language_model.model.extra_norm.weight") as record:
        ck = load_checkpoint(folder)
    assert len(record) == 1
    assert ck.unknown == ["language_model.model.extra_norm.weight"]
    assert ck.ignored == ["model.visual.blocks.0.weight"]  # (vision_tower.* is loaded: tests/vision)
    assert not ck.mtp  # an MTP head is validated (tests/engine/test_mtp.py)
    d = ck.describe()
    assert "language_model.model.extra_norm.weight" not in d["globals"]


def test_missing_shard_and_files(damaged, tmp_path):
    folder = damaged()
    mf.edit_json(os.path.join(folder, "model.safetensors.index.json"),
                 lambda i: i["weight_map"].update({"language_model.model.norm.weight": "model-00002-of-00002.safetensors"}))
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors .*norm.weight.* is missing"):
        load_checkpoint(folder)
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    os.remove(_shard(folder))
    with pytest.raises(CheckpointError, match="no \\*.safetensors weight files"):
        load_checkpoint(folder)
    os.remove(os.path.join(folder, "config.json"))
    with pytest.raises(ConfigError, match="config.json is missing"):
        load_checkpoint(folder)


def _split(src_file, folder, names_b, file_a, file_b):
    """Splits one safetensors file into two (tensors in names_b go to file_b) with our writer."""
    from metalqwen.demo_checkpoint import write_safetensors

    tensors, _ = read_safetensors_header(src_file)
    with open(src_file, "rb") as f:
        raw = f.read()
    parts = ({}, {})
    for n, t in tensors.items():
        arr = np.frombuffer(raw[t.offset:t.offset + t.nbytes], dtype=np.uint8).copy()
        view = {"U32": np.uint32, "F32": np.float32, "BF16": np.uint16}[t.dtype]
        value = arr.view(view).reshape(t.shape)
        parts[n in names_b][n] = ("BF16", value) if t.dtype == "BF16" else value
    os.remove(src_file)
    write_safetensors(os.path.join(folder, file_a), parts[0])
    write_safetensors(os.path.join(folder, file_b), parts[1])
    return parts


def test_sharded_with_index_and_without(damaged):
    folder = damaged()
    names = set(mf.read_header(_shard(folder))) - {"__metadata__"}
    second = {n for n in names if ".layers.3." in n or "embed_tokens" in n}
    parts = _split(_shard(folder), folder, second, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    weight_map = {n: f"model-0000{1 + (n in second)}-of-00002.safetensors" for n in names}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    ck = load_checkpoint(folder)
    assert len(ck.files) == 2 and {os.path.basename(f["path"]) for f in ck.describe()["files"]} == set(weight_map.values())
    n = "language_model.model.layers.3.self_attn.q_proj.weight"
    assert ck.tensors[n].file.endswith("model-00002-of-00002.safetensors")
    assert np.array_equal(ck.array(n), parts[1][n])

    # An index that disagrees with the files.
    moved = dict(weight_map, **{n: "model-00001-of-00002.safetensors"})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": moved}, f)
    with pytest.raises(CheckpointError, match=f"model-00001-of-00002.safetensors: tensor {n}: listed in"):
        load_checkpoint(folder)

    # No index: every *.safetensors is read; a tensor in two files is an error.
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    assert len(load_checkpoint(folder).files) == 2
    from metalqwen.demo_checkpoint import write_safetensors
    write_safetensors(os.path.join(folder, "zz-extra.safetensors"), {n: parts[1][n]})
    with pytest.raises(CheckpointError, match=f"tensor {n} is in both"):
        load_checkpoint(folder)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(model_type="llama"), "model_type 'llama' is not supported"),
    (lambda c: c["quantization"].update(bits=7), "quantization bits = 7 for the folder default"),
    (lambda c: c["quantization"].update(group_size=16), "quantization group_size = 16 for the folder default"),
    (lambda c: c["text_config"].update(head_dim=128), "head_dim = 128 is not supported"),
    (lambda c: c["text_config"].update(linear_value_head_dim=64), "linear_value_head_dim = 64 is not supported"),
])
def test_bad_config_in_folder(damaged, edit, match):
    folder = damaged()
    mf.edit_json(os.path.join(folder, "config.json"), edit)
    with pytest.raises(ConfigError, match=match) as e:
        load_checkpoint(folder)
    assert os.path.join(folder, "config.json") in str(e.value)
    assert isinstance(e.value, CheckpointError) and isinstance(e.value, ValueError)


def test_check_kernels_can_be_skipped(damaged):
    """head_dim 128 is a valid model the kernels don't support: validation itself still works."""
    folder = damaged()
    mf.edit_json(os.path.join(folder, "config.json"), lambda c: c["text_config"].update(head_dim=128))
    with pytest.raises(CheckpointError, match="q_proj.weight: shape \\[1024, 64\\], expected \\[512, 64\\]"):
        load_checkpoint(folder, check_kernels=False)


# ---------------------------------------------------------------------------- tokenizer and chat template


_CONVERSATIONS = [
    [{"role": "user", "content": "hi there 😀"}],
    [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}, {"role": "user", "content": "and 3+3?"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "hmm"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b", "thinking": "via alias"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": None,
      "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"city": "Zürich", "x": "<&>"}}}]},
     {"role": "tool", "content": "12°C"}],
]


@pytest.mark.parametrize("which", ["demo", "base-mlx", "base-hf"])
def test_chat_template_matches_transformers(demo, converted, which):
    transformers = require("transformers")
    folder = {"demo": demo, "base-mlx": converted("base")[1], "base-hf": converted("base")[0]}[which]
    ours = Tokenizer.from_folder(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.special_tokens_map == theirs.special_tokens_map
    for conv in _CONVERSATIONS:
        for add in (True, False):
            for thinking in (None, True, False):
                kw = {} if thinking is None else {"enable_thinking": thinking}
                text = ours.apply_chat_template(conv, add_generation_prompt=add, **kw)
                assert text == theirs.apply_chat_template(conv, add_generation_prompt=add, tokenize=False, **kw)
                ids = theirs.apply_chat_template(conv, add_generation_prompt=add, tokenize=True, **kw)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                assert ours.encode_chat(conv, add_generation_prompt=add, **kw) == list(ids)
    prompt = ours.apply_chat_template(_CONVERSATIONS[0])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert ours.apply_chat_template(_CONVERSATIONS[0], enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    for s in ["hello world", "Zürich 🚀 你好 <think>x</think> <|im_end|>", "  spaces\n\nand\ttabs  "]:
        assert ours.encode(s) == theirs.encode(s, add_special_tokens=False)
        assert ours.decode(ours.encode(s)) == theirs.decode(theirs.encode(s, add_special_tokens=False))


def test_template_file_wins_and_errors(converted, tmp_path):
    src = converted("base")[0]  # HF folder: template inside tokenizer_config.json
    folder = mf.copy_checkpoint(src, tmp_path / "tok")
    with open(os.path.join(folder, "tokenizer_config.json")) as f:
        assert "chat_template" in json.load(f)
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}")
    tok = Tokenizer.from_folder(folder)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x<|im_end|>"
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write("{% if %}")
    with pytest.raises(TokenizerError, match="syntax error"):
        Tokenizer.from_folder(folder).apply_chat_template([])
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write("{{ raise_exception('no tools here') }}")
    with pytest.raises(TokenizerError, match="no tools here"):
        Tokenizer.from_folder(folder).apply_chat_template([])
    os.remove(os.path.join(folder, "chat_template.jinja"))
    mf.edit_json(os.path.join(folder, "tokenizer_config.json"), lambda c: c.pop("chat_template"))
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_folder(folder).apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_or_corrupt_tokenizer_files(damaged):
    folder = damaged()
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        f.write("{")
    with pytest.raises(TokenizerError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_folder(folder)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write('{"model": 1}')
    with pytest.raises(TokenizerError, match="tokenizer.json cannot be loaded"):
        Tokenizer.from_folder(folder)
    os.remove(os.path.join(folder, "tokenizer.json"))
    with pytest.raises(TokenizerError, match="tokenizer.json is missing"):
        Tokenizer.from_folder(folder)
    assert issubclass(TokenizerError, CheckpointError)


def test_stream_decoder_releases_only_complete_utf8(demo):
    tok = Tokenizer.from_folder(demo)
    text = "a 🚀🎉 你好世界 Zürich ok"
    ids = tok.encode(text)
    # The test needs characters split across tokens: check the tokenizer does split some.
    split = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert split, [tok.id_to_token(i) for i in ids]
    dec = StreamDecoder(tok)
    pieces = [dec.add(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + dec.flush() == text == dec.text
    for i, p in zip(ids, pieces):
        if i == split[0]:
            assert p == ""  # first half of a character: held back
    # A character cut off at the end comes out as U+FFFD only on flush.
    dec = tok.stream_decoder()
    assert dec.add(split[0]) == "" and dec.flush() == "\ufffd"
    # Special tokens are skipped by default, kept on request.
    im_end = tok.token_to_id("<|im_end|>")
    assert tok.stream_decoder().extend(tok.encode("hi") + [im_end]) == "hi"
    assert tok.stream_decoder(skip_special_tokens=False).extend(tok.encode("hi") + [im_end]) == "hi<|im_end|>"


def test_stream_decoder_many_tokens_is_incremental(demo):
    tok = Tokenizer.from_folder(demo)
    ids = tok.encode("the model token layer 你好 🚀 " * 200)
    dec = tok.stream_decoder()
    out = "".join(dec.add(i) for i in ids) + dec.flush()
    assert out == tok.decode(ids)
    assert dec._read - dec._prefix <= 8  # the decoded window stays small


def test_find_stop():
    assert find_stop("hello </think> x", ["</think>"]) == (6, 6)
    assert find_stop("hello </th", ["</think>"]) == (None, 6)  # "</th" may still become "</think>"
    assert find_stop("hello <", ["</think>", "<|im_end|>"]) == (None, 6)
    assert find_stop("abc", ["</think>"]) == (None, 3)
    assert find_stop("a STOP b END", ["END", "STOP"]) == (2, 2)  # earliest wins, whatever the list order
    assert find_stop("x", [""]) == (None, 1)


def test_stop_matcher_across_pieces():
    m = StopMatcher(["<|im_end|>", "\n\nUser:"])
    out = []
    for piece in ["Hello", " wor", "ld<|im", "_e", "nd|> never"]:
        text, stopped = m.feed(piece)
        out.append(text)
    assert "".join(out) == "Hello world" and stopped and m.stop == "<|im_end|>"
    assert m.feed("more") == ("", True) and m.flush() == ""

    m = StopMatcher("<|im_end|>")
    assert m.feed("a <|im") == ("a ", False)   # held: could be the stop string
    assert m.feed("age") == ("<|image", False)  # diverged: released
    assert m.feed(" <") == (" ", False)
    assert m.flush() == "<"


@pytest.mark.parametrize("shift, says", [(-1.0, "not shifted"), (1.0, "shifted twice")])
def test_norms_in_the_wrong_convention_are_refused(damaged, shift, says):
    folder = damaged()
    ck = load_checkpoint(folder)  # the control: the converted folder's norms sit near 1
    for name, t in ck.tensors.items():
        if name.endswith((".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
                          ".k_norm.weight", "model.norm.weight")):
            stored = np.memmap(t.file, dtype=np.uint16, mode="r+", offset=t.offset, shape=(t.nbytes // 2,))
            stored[:] = bf16_bits(bf16_to_f32(np.array(stored)) + np.float32(shift))
            stored.flush()
            del stored
    with pytest.raises(CheckpointError, match=f"RMSNorm weights .* have median .*{says}"):
        load_checkpoint(folder)
