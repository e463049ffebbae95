"""The layout of an MLX-format Qwen3.5 checkpoint: tensor names, prefixes, what each module
holds (``Linear``, ``Vector``, ``layer_spec``, ``global_spec``), the dtypes the engine takes,
and the RMSNorm storage conventions. Shared by the trunk's loader (checkpoint.py) and the MTP
head's (mtp_checkpoint.py); it reads nothing.

Tensor names are the ones ``mlx_lm.convert`` writes: ``language_model.model.*`` and
``language_model.lm_head`` (absent when the embeddings are tied). Their layout:

    affine linear / embedding     P.weight U32 [out, in*bits/32] (bits 2, 3, 4, 5, 6, 8),
                                  P.scales BF16 [out, in/group], P.biases BF16 [out, in/group]
                                  (w = scale * q + bias; group 32, 64, 128)
    mxfp4 / nvfp4 / mxfp8         P.weight U32 [out, in*bits/32], P.scales U8 [out, in/group], no biases
                                  (config.json's quantization "mode" says which; see shaders/params/quant.h)
    float linear (left unquantized) P.weight BF16, F16 or F32 [out, in]
    norms (stored as 1 + w)       BF16, F16 or F32 [n]; linear_attn.norm (not shifted) [d_v]
    linear_attn.conv1d.weight     [C, K, 1];  dt_bias [n_v];  A_log F32, BF16 or F16 [n_v]
    (affine scales/biases may be F16/F32 too, at group 64; F16 vectors/scales are widened to
    f32 copies at load, BF16 and F32 ones are used in place)
    MoE experts (switch_mlp.*)    the same with a leading [experts] axis on every tensor
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig

__all__ = ["A_LOG_DTYPES", "CONVENTION_HOW", "FLOAT_DTYPES", "FLOAT_LINEAR_DTYPES", "IGNORED_PREFIXES", "LM", "Linear",
           "MODEL", "MTP_PREFIXES", "SCALE_DTYPES", "SHIFTED_NORMS", "Vector", "global_spec", "layer_spec", "mlp_spec",
           "moe_spec", "norm_convention"]

# dtypes the engine accepts for each kind of tensor. Kernels read vectors and affine
# scales/biases as bf16 (as stored) or f32 (stored so, or F16 widened at load): tensors
# one kernel reads together must agree on that width (Validator.check_widths).
FLOAT_DTYPES = ("BF16", "F16", "F32")
FLOAT_LINEAR_DTYPES = ("BF16", "F16", "F32")  # unquantized projections, embeddings, lm_head
A_LOG_DTYPES = ("F32", "BF16", "F16")
SCALE_DTYPES = ("BF16", "F16", "F32")


@dataclass(frozen=True)
class Linear:
    module: str  # module path, e.g. language_model.model.layers.0.mlp.down_proj
    out_features: int
    in_features: int
    experts: int = 0  # > 0: a stack of that many [out, in] matrices (MoE switch_mlp)


@dataclass(frozen=True)
class Vector:
    name: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...] = FLOAT_DTYPES


LM = "language_model."
MODEL = "language_model.model."


def layer_spec(cfg: ModelConfig, full_attention: bool) -> list:
    """What a decoder layer must hold, with names relative to its prefix (``language_model.model.layers.{i}.``)."""
    H = cfg.hidden_size
    spec: list = [
        Vector("input_layernorm.weight", (H,)),
        Vector("post_attention_layernorm.weight", (H,)),
        *(moe_spec(cfg) if cfg.is_moe else mlp_spec("mlp.", H, cfg.intermediate_size)),
    ]
    if full_attention:
        nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        spec += [
            Linear("self_attn.q_proj", nq * hd * 2, H),  # per head [query | gate]
            Linear("self_attn.k_proj", nkv * hd, H),
            Linear("self_attn.v_proj", nkv * hd, H),
            Linear("self_attn.o_proj", H, nq * hd),
            Vector("self_attn.q_norm.weight", (hd,)),
            Vector("self_attn.k_norm.weight", (hd,)),
        ]
    else:
        nv = cfg.linear_num_value_heads
        spec += [
            Linear("linear_attn.in_proj_qkv", cfg.linear_conv_dim, H),
            Linear("linear_attn.in_proj_z", cfg.linear_value_dim, H),
            Linear("linear_attn.in_proj_b", nv, H),
            Linear("linear_attn.in_proj_a", nv, H),
            Linear("linear_attn.out_proj", H, cfg.linear_value_dim),
            Vector("linear_attn.conv1d.weight", (cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, 1)),
            Vector("linear_attn.dt_bias", (nv,)),
            Vector("linear_attn.A_log", (nv,), A_LOG_DTYPES),
            Vector("linear_attn.norm.weight", (cfg.linear_value_head_dim,)),
        ]
    return spec


def mlp_spec(prefix: str, H: int, I: int) -> list:
    return [Linear(prefix + "gate_proj", I, H), Linear(prefix + "up_proj", I, H), Linear(prefix + "down_proj", H, I)]


def moe_spec(cfg: ModelConfig) -> list:
    """The sparse MoE block as mlx-lm names it (qwen3_next's SparseMoeBlock): router, stacked experts,
    shared expert and its gate."""
    H, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    return [
        Linear("mlp.gate", E, H),
        Linear("mlp.switch_mlp.gate_proj", I, H, E),
        Linear("mlp.switch_mlp.up_proj", I, H, E),
        Linear("mlp.switch_mlp.down_proj", H, I, E),
        *mlp_spec("mlp.shared_expert.", H, cfg.shared_expert_intermediate_size),
        Linear("mlp.shared_expert_gate", 1, H),
    ]


def global_spec(cfg: ModelConfig) -> list:
    spec: list = [
        Linear(MODEL + "embed_tokens", cfg.vocab_size, cfg.hidden_size),
        Vector(MODEL + "norm.weight", (cfg.hidden_size,)),
    ]
    if not cfg.tie_word_embeddings:
        spec.append(Linear(LM + "lm_head", cfg.vocab_size, cfg.hidden_size))
    return spec


# Tensors that are recognised and deliberately not used: vision towers in layouts other than
# mlx-vlm's vision_tower.* (which vision_checkpoint.py loads), and the MTP head (listed apart,
# see Checkpoint.mtp).
IGNORED_PREFIXES = ("model.visual.", "language_model.vision_tower.")
MTP_PREFIXES = ("mtp.", "language_model.mtp.", "language_model.model.mtp.")


# The zero-centred RMSNorms (used as 1 + w) that MLX folders store shifted, as 1 + w.
SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
                 MODEL + "norm.weight")


def norm_convention(median: float) -> str:
    """How zero-centred norms (used as 1 + w) with this median are stored: "shifted" (1 + w, w small:
    MLX's convention, median near 1), "unshifted" (Hugging Face's w, near 0) or "twice" (1 + 1 + w, near 2)."""
    return "shifted" if 0.5 <= median <= 1.5 else "unshifted" if median < 0.5 else "twice"


CONVENTION_HOW = {"unshifted": "not shifted (stored as Hugging Face's w instead of MLX's 1 + w)",
                  "twice": "shifted twice (1 + 1 + w, an old converter's mistake)"}
