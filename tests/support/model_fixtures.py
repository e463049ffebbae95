"""Tiny random Qwen3.5 checkpoints for the tests, made the way users get theirs.

``write_hf_checkpoint`` writes a Hugging Face-format folder (names under
``model.language_model.*``, the five zero-centred norms unshifted, conv1d ``[C, 1, K]``,
optional ``mtp.*``, A_log float32, the rest bf16) with numpy and our safetensors writer
(the installed transformers has no torch, so its model classes cannot run);
``convert_to_mlx`` then runs mlx-lm's own converter on it, so the MLX folders the tests
load are exactly what ``mlx_lm.convert`` produces. ``VARIANTS`` lists the shapes the
tests cover; ``checkpoint(name, root)`` builds one variant once per process.

``reference_logits`` / ``reference_greedy`` run mlx-lm on an MLX folder in float32.
No tests here: helpers only.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from metalqwen.demo_checkpoint import (
    DEMO_DIMS,
    bf16_bits,
    bf16_to_f32,
    build_tokenizer,
    hf_tensors,
    random_weights,
    text_config,
    write_safetensors,
    write_tokenizer_files,
)

# ---------------------------------------------------------------------------- Hugging Face folders


@functools.lru_cache(maxsize=None)
def _tokenizer_json() -> str:
    return build_tokenizer().to_str()


def write_hf_checkpoint(
    folder,
    *,
    seed: int = 0,
    tied: bool = True,
    nested: bool = True,
    layer_types: bool = True,
    mtp: bool = False,
    a_log_dtype: str = "F32",
    template_file: bool = False,
    moe: dict | None = None,
    mixer_gain: float = 1.0,
    edit=None,
    **dims,
) -> str:
    """Writes a tiny random Qwen3.5 checkpoint in the Hugging Face layout; returns the folder.

    ``nested`` puts the text fields under ``text_config`` (the real multimodal layout)
    instead of flat; ``layer_types`` writes the explicit list besides the interval;
    ``mtp`` adds the multi-token-prediction head (mlx-lm's converter drops it);
    ``template_file`` puts the chat template in chat_template.jinja; ``moe`` (the MoE
    config fields, see ``moe_weights``) makes it a qwen3_5_moe model; ``mixer_gain`` scales
    every projection that writes into the residual stream (o_proj, out_proj, down_proj);
    ``edit(weights)`` may then change the float32 weights (HF names, norms unshifted).
    """
    from tokenizers import Tokenizer

    d = {**DEMO_DIMS, **dims}
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tok = write_tokenizer_files(folder, Tokenizer.from_str(_tokenizer_json()), template_file=template_file)

    weights = random_weights(d, seed, mtp=mtp)
    if moe is not None:
        weights = moe_weights(weights, d, moe, seed)
    for name in weights:
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * np.float32(mixer_gain)
    if edit is not None:
        edit(weights)
    tensors = hf_tensors(weights, tied=tied, a_log_bf16=a_log_dtype != "F32")
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata={"format": "pt"})

    tc = text_config(d, tied=tied, eos=tok["endoftext"], layer_types=layer_types, mtp_layers=1)
    model_type = "qwen3_5"
    if moe is not None:
        # Qwen3.5-MoE configs have no dense intermediate_size.
        model_type = "qwen3_5_moe"
        del tc["intermediate_size"]
        tc.update(model_type="qwen3_5_moe_text", **moe)
    if nested:
        config = {
            "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
            "model_type": model_type,
            "tie_word_embeddings": tied,
            "text_config": tc,
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 2, "hidden_size": 64},
            "image_token_id": 248056,
        }
    else:
        config = {**tc, "model_type": model_type, "architectures": ["Qwen3_5ForCausalLM"], "torch_dtype": "bfloat16"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok["eos"], tok["endoftext"]], "temperature": 0.6, "top_k": 20}, f, indent=2)
    return folder


def moe_weights(weights: dict, dims: dict, moe: dict, seed: int) -> dict:
    """Replaces each layer's dense MLP by a Qwen3.5-MoE sparse block, named as the Hugging Face
    originals store it: router ``mlp.gate`` [E, H], the experts fused as
    ``mlp.experts.gate_up_proj`` [E, 2*I, H] (gate rows first) and ``mlp.experts.down_proj``
    [E, H, I] (no ``.weight`` suffix; mlx-lm's sanitize splits them into ``switch_mlp.*``),
    ``mlp.shared_expert.{gate,up,down}_proj`` and ``mlp.shared_expert_gate`` [1, H].
    ``moe`` holds the config fields num_experts, moe_intermediate_size and
    shared_expert_intermediate_size (the rest are passed through to config.json).
    """
    rng = np.random.default_rng(seed + 1000)
    H, E, I, S = (dims["hidden_size"], moe["num_experts"], moe["moe_intermediate_size"],
                  moe["shared_expert_intermediate_size"])

    def lin(*shape, gain=1.0):
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(gain / np.sqrt(shape[-1]))
        return bf16_to_f32(bf16_bits(w))

    out = {k: v for k, v in weights.items() if not (k.startswith("model.layers.") and ".mlp." in k)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp"
        # A router gain of 4 spreads the softmax so the top-k choice varies from token to token.
        out[f"{p}.gate.weight"] = lin(E, H, gain=4.0)
        out[f"{p}.experts.gate_up_proj"] = lin(E, 2 * I, H)
        out[f"{p}.experts.down_proj"] = lin(E, H, I, gain=0.5)
        out[f"{p}.shared_expert.gate_proj.weight"] = lin(S, H)
        out[f"{p}.shared_expert.up_proj.weight"] = lin(S, H)
        out[f"{p}.shared_expert.down_proj.weight"] = lin(H, S, gain=0.5)
        out[f"{p}.shared_expert_gate.weight"] = lin(1, H)
    return out


def convert_to_mlx(hf_path, mlx_path, *, bits: int | None = 4, group_size: int | None = 64, mode: str = "affine",
                   quant_predicate=None, quantize: bool = True, dtype: str | None = None) -> str:
    """Runs ``mlx_lm.convert(hf_path, mlx_path, quantize=quantize, ...)`` quietly; returns mlx_path.
    ``quant_predicate`` may be a function or one of mlx-lm's recipe names (``mixed_3_6``, ...);
    ``dtype`` (float16, float32) is what the converter casts the float parameters to."""
    from mlx_lm import convert

    with contextlib.redirect_stdout(io.StringIO()):
        convert(os.fspath(hf_path), os.fspath(mlx_path), quantize=quantize, q_group_size=group_size, q_bits=bits,
                q_mode=mode, quant_predicate=quant_predicate, dtype=dtype)
    return os.fspath(mlx_path)


# ---------------------------------------------------------------------------- the variants


def _mixed_predicate(path, module):
    """down_proj at 8 bits / group 32 (recorded in config.json), in_proj_a left in bf16 (not recorded)."""
    if path.endswith("mlp.down_proj"):
        return {"group_size": 32, "bits": 8}
    if path.endswith("linear_attn.in_proj_a"):
        return False
    return True


def _affine_bits_predicate(path, module):
    """Every affine width in one folder (each with its own group size, recorded in config.json),
    and the attention/DeltaNet output projections left in bf16."""
    for suffix, quant in [("mlp.gate_proj", (2, 32)), ("mlp.up_proj", (3, 64)), ("mlp.down_proj", (5, 128)),
                          ("in_proj_qkv", (6, 32)), ("in_proj_z", (3, 128)), ("q_proj", (5, 32)),
                          ("k_proj", (6, 128)), ("v_proj", (2, 64)), ("embed_tokens", (8, 32)), ("lm_head", (3, 32))]:
        if path.endswith(suffix):
            return {"bits": quant[0], "group_size": quant[1], "mode": "affine"}
    if path.endswith(("o_proj", "out_proj")):
        return False
    return True


def _fp_modes_predicate(path, module):
    """A folder whose default is mxfp4, with nvfp4 and mxfp8 modules recorded per module."""
    if path.endswith(("mlp.down_proj", "in_proj_z", "o_proj")):
        return {"bits": 4, "group_size": 16, "mode": "nvfp4"}
    if path.endswith(("mlp.up_proj", "out_proj", "k_proj")):
        return {"bits": 8, "group_size": 32, "mode": "mxfp8"}
    return True


def _f16_predicate(path, module):
    """With --dtype float16: 3-, 4- and 6-bit modules with f16 scales, o_proj/out_proj left in f16."""
    if path.endswith(("o_proj", "out_proj")):
        return False
    if path.endswith("mlp.down_proj"):
        return {"bits": 6, "group_size": 64, "mode": "affine"}
    if path.endswith("in_proj_qkv"):
        return {"bits": 3, "group_size": 64, "mode": "affine"}
    return True


def _moe_mixed_predicate(path, module):
    """The experts' and the shared expert's up_proj at 8 bits / group 32 beside 4-bit gate_proj
    (the router and shared_expert_gate at mlx-lm's 8 bits): gate/up pairs of two formats."""
    if path.endswith(("switch_mlp.up_proj", "shared_expert.up_proj")):
        return {"group_size": 32, "bits": 8}
    if path.endswith(("mlp.gate", "mlp.shared_expert_gate")):
        return {"group_size": 64, "bits": 8}
    return True


@dataclass(frozen=True)
class Variant:
    """One tiny checkpoint shape: HF writer options, model dims and conversion settings."""

    bits: int = 4
    group_size: int = 64
    tied: bool = True
    nested: bool = True
    layer_types: bool = True
    mtp: bool = False
    a_log_dtype: str = "F32"
    template_file: bool = False
    mode: str = "affine"
    quantize: bool = True
    predicate: object = None  # a quant_predicate function or an mlx-lm recipe name
    dtype: str | None = None  # mlx_lm.convert --dtype
    moe: dict | None = None
    mixer_gain: float = 1.0
    dims: dict = field(default_factory=dict)

    def hf_kwargs(self) -> dict:
        return dict(tied=self.tied, nested=self.nested, layer_types=self.layer_types, mtp=self.mtp,
                    a_log_dtype=self.a_log_dtype, template_file=self.template_file, moe=self.moe,
                    mixer_gain=self.mixer_gain, **self.dims)


VARIANTS = {
    # hidden 512, 3 DeltaNet + 1 attention, tied, 4-bit group 64: the demo's shape via mlx-lm.
    "base": Variant(),
    # hidden 1024, interval 2 (no layer_types list), untied, 4-bit group 32, MTP dropped by the converter.
    "wide_untied_g32": Variant(
        group_size=32, tied=False, layer_types=False, mtp=True, template_file=True,
        dims=dict(hidden_size=1024, intermediate_size=2048, num_attention_heads=4, num_key_value_heads=2,
                  linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=2),
    ),
    # flat config.json (no text_config), 8-bit group 64, A_log in bf16, 6 layers alternating (interval 2).
    "flat_b8": Variant(
        bits=8, tied=False, nested=False, a_log_dtype="BF16",
        dims=dict(num_hidden_layers=6, full_attention_interval=2, linear_num_key_heads=1, linear_num_value_heads=2),
    ),
    # per-module overrides: down_proj 8-bit group 32, in_proj_a kept in bf16.
    "mixed": Variant(predicate=_mixed_predicate),
    # affine 2, 3, 5, 6 and 8 bits at groups 32/64/128, o_proj/out_proj in bf16, untied.
    "affine_bits": Variant(tied=False, predicate=_affine_bits_predicate),
    # mlx-lm's mixed_3_6 recipe: 3-bit, with v_proj/down_proj of some layers and lm_head at 6 bits.
    "recipe_3_6": Variant(tied=False, predicate="mixed_3_6"),
    # the other recipes of mlx_lm.convert --quant-predicate (tests/checkpoint/test_recipes.py).
    "recipe_2_6": Variant(tied=False, predicate="mixed_2_6"),
    "recipe_3_4": Variant(tied=False, predicate="mixed_3_4"),
    "recipe_4_6": Variant(tied=False, predicate="mixed_4_6"),
    # microscaling FP: mxfp4 by default (embedding included), nvfp4 and mxfp8 modules.
    "fp_modes": Variant(tied=False, mode="mxfp4", bits=None, group_size=None, predicate=_fp_modes_predicate),
    # unquantized: every projection, the embedding and lm_head in bf16.
    "bf16": Variant(tied=False, quantize=False),
    # --dtype float16: f16 norms, conv, dt_bias and scales/biases (widened at load), f16 o_proj/out_proj.
    "f16": Variant(dtype="float16", predicate=_f16_predicate),
    # --dtype float32, unquantized: f32 projections, embedding, norms and vectors.
    "f32": Variant(quantize=False, dtype="float32"),
    # residual writers at gain 1e-4, untied: the next token depends mostly on the current one,
    # so greedy output soon cycles (prompt-lookup drafts get accepted).
    "repetitive": Variant(tied=False, mixer_gain=1e-4),
    # qwen3_5_moe: 8 experts, top-2 renormalised, 4-bit group 64 (router and shared_expert_gate
    # at 8 bits group 64 by mlx-lm's quant predicate), nested config, tied.
    "moe": Variant(moe=dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                            shared_expert_intermediate_size=256, norm_topk_prob=True)),
    # qwen3_5_moe as "moe", with gate_proj and up_proj of different formats (_moe_mixed_predicate).
    "moe_mixed": Variant(moe=dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                                  shared_expert_intermediate_size=256, norm_topk_prob=True),
                         predicate=_moe_mixed_predicate),
    # qwen3_5_moe: 40 experts (more than a SIMD-group's lanes), top-3 not renormalised,
    # 8-bit group 32, flat config, untied, 6 layers alternating.
    "moe_top3_b8": Variant(
        bits=8, group_size=32, tied=False, nested=False,
        moe=dict(num_experts=40, num_experts_per_tok=3, moe_intermediate_size=64,
                 shared_expert_intermediate_size=128, norm_topk_prob=False),
        dims=dict(num_hidden_layers=6, full_attention_interval=2, linear_num_key_heads=1, linear_num_value_heads=2),
    ),
}


def build_variant(name: str, root) -> tuple[str, str]:
    """Writes variant ``name``'s HF folder and converts it; returns (hf_path, mlx_path)."""
    v = VARIANTS[name]
    hf = write_hf_checkpoint(os.path.join(os.fspath(root), f"{name}-hf"), seed=len(name), **v.hf_kwargs())
    mlx = convert_to_mlx(hf, os.path.join(os.fspath(root), f"{name}-mlx"), bits=v.bits, group_size=v.group_size,
                         mode=v.mode, quant_predicate=v.predicate, quantize=v.quantize, dtype=v.dtype)
    return hf, mlx


_BUILT: dict[tuple[str, str], tuple[str, str]] = {}


def checkpoint(name: str, root) -> tuple[str, str]:
    """``build_variant`` memoised per (name, root): a session fixture calls this with its tmp dir."""
    key = (name, os.fspath(root))
    if key not in _BUILT:
        _BUILT[key] = build_variant(name, root)
    return _BUILT[key]


# ---------------------------------------------------------------------------- damaging copies (bad-input tests)


def copy_checkpoint(src, dst) -> str:
    """A private copy of a checkpoint folder that a test may damage."""
    shutil.copytree(os.fspath(src), os.fspath(dst))
    return os.fspath(dst)


def read_header(path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def rewrite_header(path, edit) -> None:
    """Rewrites a safetensors file's header with ``edit(header_dict)`` applied; the data bytes are kept."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    edit(header)
    raw = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def add_tensors(path, tensors: dict) -> None:
    """Appends tensors ``{name: (dtype_tag, shape, raw bytes)}`` to a safetensors file (data at the end)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    raw_header = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw_header)) + raw_header + data)


def edit_json(path, edit) -> None:
    """Applies ``edit(dict)`` to a JSON file in place."""
    with open(path) as f:
        d = json.load(f)
    edit(d)
    with open(path, "w") as f:
        json.dump(d, f, indent=2)


# ---------------------------------------------------------------------------- an independent numpy forward


def numpy_forward(ck, token_ids) -> np.ndarray:
    """Logits [T, vocab] of a loaded ``metalqwen.checkpoint.Checkpoint``, in float64 numpy,
    written from docs/design.md "The model" alone (not from mlx-lm): a cross-check that the
    mlx-lm reference and our reading of the checkpoint mean the same model.
    """
    m = numpy_model(ck)
    return m.logits(m.hidden(token_ids))


def numpy_model(ck) -> SimpleNamespace:
    """The pieces of ``numpy_forward`` (float64): ``f(name)`` a float tensor (MTP norms with their
    load-time shift), ``linear(module, x)``, ``rms(x, w)``, ``embed`` [vocab, H],
    ``layer(prefix, kind, x)`` one decoder layer over the residual rows x [T, H] at positions
    0..T-1, ``hidden(ids, pre_norm=False)`` the trunk's last state (after the final norm, or
    before it) and ``logits(h)`` the lm_head's scores."""
    from . import reference as ref

    c = ck.config

    def f(name):
        a, t = ck.array(name), ck.tensors.get(name) or ck.mtp[name]
        v = (ref.bf16_to_f32(a) if t.dtype == "BF16" else np.asarray(a, np.float32)).astype(np.float64)
        return v + t.add

    def weight(module, expert=None):
        """The float weight of a module, or of one expert of a stacked switch_mlp module."""
        q = ck.quant(module)
        part = (lambda a: a) if expert is None else (lambda a: a[expert])
        if q is None:
            return part(f(module + ".weight"))
        w = part(ck.array(module + ".weight"))
        if q.mode != "affine":
            return ref.dequantize_fp(w, part(ck.array(module + ".scales")), q.mode).astype(np.float64)
        codes = ref.unpack_bits(w, q.bits).astype(np.float64)
        s, b = (np.repeat(part(f(f"{module}.{p}")), q.group_size, axis=-1) for p in ("scales", "biases"))
        return s * codes + b

    def linear(module, x):
        return x @ weight(module).T

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_norm_eps) * w

    def silu(x):
        return x / (1 + np.exp(-x))

    def dense_mlp(prefix, h):
        return linear(prefix + "down_proj", silu(linear(prefix + "gate_proj", h)) * linear(prefix + "up_proj", h))

    def moe_mlp(prefix, h):
        """Softmax router, top-k (renormalised if the config says so), experts, sigmoid-gated shared expert."""
        z = linear(prefix + "gate", h)
        probs = np.exp(z - z.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : c.num_experts_per_tok]
        w = np.take_along_axis(probs, top, -1)
        if c.norm_topk_prob:
            w /= w.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        s = prefix + "switch_mlp."
        for e in np.unique(top):
            rows, slots = np.nonzero(top == e)
            x = h[rows]
            y = silu(x @ weight(s + "gate_proj", e).T) * (x @ weight(s + "up_proj", e).T)
            out[rows] += w[rows, slots][:, None] * (y @ weight(s + "down_proj", e).T)
        gate = 1 / (1 + np.exp(-linear(prefix + "shared_expert_gate", h)))
        return out + gate * dense_mlp(prefix + "shared_expert.", h)

    embed = weight("language_model.model.embed_tokens")

    def layer(p, kind, x):
        T = len(x)
        h = rms(x, f(p + "input_layernorm.weight"))
        if kind == "full_attention":
            nq, nkv, hd, rot = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim
            qg = linear(p + "self_attn.q_proj", h).reshape(T, nq, 2 * hd)  # per head [query | gate]
            q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nq * hd)
            k = linear(p + "self_attn.k_proj", h).reshape(T, nkv, hd)
            v = linear(p + "self_attn.v_proj", h).reshape(T, nkv, hd)
            q, k = rms(q, f(p + "self_attn.q_norm.weight")), rms(k, f(p + "self_attn.k_norm.weight"))
            inv = c.rope_theta ** (-np.arange(0, rot, 2) / rot)
            ang = np.arange(T)[:, None] * inv[None, :]
            cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

            def rope(t):
                t = t.copy()
                a, b = t[..., : rot // 2].copy(), t[..., rot // 2: rot].copy()
                t[..., : rot // 2], t[..., rot // 2: rot] = a * cos - b * sin, b * cos + a * sin
                return t

            q, k = rope(q), rope(k)
            kv_of = np.arange(nq) // (nq // nkv)
            s = np.einsum("tnd,snd->nts", q, k[:, kv_of]) / np.sqrt(hd)
            s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            attn = np.einsum("nts,snd->tnd", pr, v[:, kv_of]).reshape(T, nq * hd)
            mixed = linear(p + "self_attn.o_proj", attn * (1 / (1 + np.exp(-gate))))
        else:
            nk, nv, dk, dv, K = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                                 c.linear_value_head_dim, c.linear_conv_kernel_dim)
            a = p + "linear_attn."
            qkv = linear(a + "in_proj_qkv", h)
            z = linear(a + "in_proj_z", h).reshape(T, nv, dv)
            beta = 1 / (1 + np.exp(-linear(a + "in_proj_b", h)))
            alpha = linear(a + "in_proj_a", h)
            w = f(a + "conv1d.weight")[:, :, 0]  # [C, K]; w[:, K-1] multiplies the current token
            padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
            conv = silu(sum(w[:, j] * padded[j: j + T] for j in range(K)))
            q = conv[:, : nk * dk].reshape(T, nk, dk)
            k = conv[:, nk * dk: 2 * nk * dk].reshape(T, nk, dk)
            v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            decay = np.exp(-np.exp(f(a + "A_log")) * np.logaddexp(0, alpha + f(a + "dt_bias")))
            k_of = np.arange(nv) // (nv // nk)  # grouped, not tiled
            S = np.zeros((nv, dv, dk))
            y = np.zeros((T, nv, dv))
            for t in range(T):
                kt, qt = k[t, k_of], q[t, k_of]
                S *= decay[t][:, None, None]
                kv = np.einsum("hvk,hk->hv", S, kt)
                S += np.einsum("hv,hk->hvk", (v[t] - kv) * beta[t][:, None], kt)
                y[t] = np.einsum("hvk,hk->hv", S, qt)
            y = y / np.sqrt(np.mean(y * y, -1, keepdims=True) + c.rms_norm_eps) * f(a + "norm.weight") * silu(z)
            mixed = linear(a + "out_proj", y.reshape(T, nv * dv))
        x = x + mixed
        h = rms(x, f(p + "post_attention_layernorm.weight"))
        return x + (moe_mlp if c.is_moe else dense_mlp)(p + "mlp.", h)

    def hidden(token_ids, pre_norm=False):
        x = embed[np.asarray(token_ids)]
        for i, kind in enumerate(c.layer_types):
            x = layer(ck.layer_prefix(i), kind, x)
        return x if pre_norm else rms(x, f("language_model.model.norm.weight"))

    head = embed if c.tie_word_embeddings else weight("language_model.lm_head")
    return SimpleNamespace(f=f, linear=linear, rms=rms, embed=embed, layer=layer, hidden=hidden,
                           logits=lambda h: h @ head.T)


# ---------------------------------------------------------------------------- mlx-lm references


@functools.lru_cache(maxsize=8)
def _reference_model(mlx_path: str, native: bool):
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model, load_model
    from pathlib import Path

    model, _ = load_model(Path(mlx_path))
    if not native:
        # Scales/biases to f32 first (exact), so dequantize yields the exact f32 weights.
        model.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                              model.parameters()))
        model = dequantize_model(model)
        mx.eval(model.parameters())
    return model


def reference_logits(mlx_path, token_ids, native: bool = False) -> np.ndarray:
    """mlx-lm's logits for ``token_ids`` at every position: float32 [T, vocab].

    What is fair to compare an engine with: the function the checkpoint defines, not
    one particular rounding of it. So by default every floating parameter is cast to
    float32 (exact: bf16 and the f32 A_log embed losslessly), the quantized linears and
    the embedding are dequantized from those f32 scales/biases (``scale * q + bias``,
    exact in f32 to within one rounding of the add), and mlx-lm's own forward pass then
    runs in float32 end to end (its DeltaNet recurrence and attention on the CPU). An
    engine that keeps the 4-bit weights, bf16/f16 activations and f32 accumulators
    differs from this by its own rounding only, which tests bound with a tolerance.

    ``native=True`` instead runs mlx-lm as users do (bf16 activations, mlx's quantized
    matmul on the packed weights). Never compare an engine against it: it mixes a second,
    independent rounding in, and on a CPU it is far off (mlx's CPU quantized matmul
    accumulates bf16 inputs in bf16: about 5 % relative error per layer on these models,
    where the Metal kernels accumulate in f32). ``numpy_forward`` agrees with the f32
    reference to ~1e-5.
    """
    import mlx.core as mx

    model = _reference_model(os.fspath(mlx_path), native)
    ids = mx.array(np.asarray(token_ids, dtype=np.int32)[None, :])
    out = model(ids)[0].astype(mx.float32)
    return np.array(out)


def reference_greedy(mlx_path, prompt_ids, n: int, native: bool = False) -> list[int]:
    """Greedy continuation of ``prompt_ids`` by mlx-lm in float32 (see reference_logits): n new ids.

    Runs the prompt once, then one token per step through mlx-lm's own caches (KV cache
    and DeltaNet conv/recurrent state), as generation does.
    """
    import mlx.core as mx

    model = _reference_model(os.fspath(mlx_path), native)
    cache = model.make_cache()
    logits = model(mx.array(np.asarray(prompt_ids, dtype=np.int32)[None, :]), cache=cache)
    out = []
    for _ in range(n):
        token = int(mx.argmax(logits[0, -1].astype(mx.float32)).item())
        out.append(token)
        logits = model(mx.array([[token]], dtype=mx.int32), cache=cache)
    return out
