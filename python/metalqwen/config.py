"""Model configuration of a Qwen3.5 checkpoint folder (config.json + generation_config.json).

The text fields may sit flat in config.json or nested under ``text_config`` (the
multimodal Qwen3_5ForConditionalGeneration layout that mlx-lm conversions keep).
Everything the engine needs is parsed and checked here, once, so that later code can
trust a ``ModelConfig``; every error names the file, the field and the value at fault.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, NamedTuple

from . import _core, sampling
from .errors import MetalqwenError

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ModelConfig",
    "check_supported",
    "load_config",
    "SUPPORTED_BITS",
    "SUPPORTED_GROUP_SIZES",
    "FP_MODES",
    "WEIGHT_FORMATS",
    "WIDE_SCALE_GROUPS",
    "Quant",
]

# The weight formats the kernels are instantiated for, as the engine names them (the one list:
# shaders/params/quant.h, exported by _core): affine b<bits>_g<group> (bf16 scales) and
# b<bits>_g<group>_sf32 (f32 scales), mlx's FP modes by name, unquantized bf16 / f16 / f32.
WEIGHT_FORMATS = tuple(_core.weight_formats())
_AFFINE = [(int(m[1]), int(m[2]), bool(m[3]))
           for m in (re.fullmatch(r"b(\d+)_g(\d+)(_sf32)?", f) for f in WEIGHT_FORMATS) if m]
SUPPORTED_BITS = tuple(sorted({bits for bits, _, _ in _AFFINE}))
SUPPORTED_GROUP_SIZES = tuple(sorted({group for _, group, wide in _AFFINE if not wide}))
WIDE_SCALE_GROUPS = tuple(sorted({group for _, group, wide in _AFFINE if wide}))  # f16/f32 scales
# mlx's microscaling FP modes and the (bits, group_size) each one has (no other exists), where
# the kernels have them.
FP_MODES = {mode: bits_group for mode, bits_group in {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}.items()
            if mode in WEIGHT_FORMATS}


class Quant(NamedTuple):
    """How one module is quantized. ``mode`` None: config.json does not say (mlx-lm reads
    that as affine; checkpoint validation resolves it from the scales' dtype)."""

    bits: int
    group_size: int
    mode: str | None = "affine"

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
_LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)

# Top-level model types whose checkpoints this loader understands: mlx-lm's modules
# (qwen3_5_text / qwen3_5_moe_text are the *nested* text_config's types, never a folder's).
_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
_TEXT_MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")

# Sizes moe.metal is specialised for (shaders/params/moe.h, exported by _core).
MAX_EXPERTS = _core.MAX_EXPERTS
MAX_EXPERTS_PER_TOKEN = _core.MAX_EXPERTS_PER_TOKEN


class CheckpointError(MetalqwenError, ValueError):
    """A checkpoint folder that cannot be used; the message names the file and the tensor or field."""


class ConfigError(CheckpointError):
    """config.json / generation_config.json content that is missing, malformed or unsupported."""


@dataclass(frozen=True)
class ModelConfig:
    """The text model of a Qwen3.5 checkpoint, as the engine consumes it.

    ``layer_types[i]`` is "linear_attention" (Gated DeltaNet) or "full_attention".
    ``num_experts`` > 0 makes every layer's MLP a sparse MoE block (mlx-lm's rule): a
    router over ``num_experts``, the ``num_experts_per_tok`` most probable experts of
    ``moe_intermediate_size`` (their weights renormalised when ``norm_topk_prob``) and a
    shared expert of ``shared_expert_intermediate_size`` gated by sigmoid(shared_expert_gate);
    ``intermediate_size`` (the dense MLP) is then 0 when the config omits it.
    ``quant_default`` is the folder-wide Quant(bits, group_size, mode) or None when unquantized;
    ``quant_overrides`` maps module paths (``language_model.model.layers.0.mlp.down_proj``)
    to a Quant or None (kept in float). Use ``quant_for`` rather than these.
    """

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    rope_type: str
    layer_types: tuple[str, ...]
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    attention_bias: bool = False
    attn_output_gate: bool = True
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # Multimodal RoPE: rotary pairs per (time, height, width) position component
    # (rope_parameters.mrope_section, interleaved); () when the config gives none.
    mrope_section: tuple[int, ...] = ()
    quant_default: Quant | None = None
    quant_overrides: tuple[tuple[str, Quant | None], ...] = ()
    source: str = "config.json"
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The sampling settings generation_config.json recommends (Qwen's: temperature, top_k, top_p),
    # which every front end uses for the fields its user leaves out.
    sampling_defaults: Mapping[str, float] = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ derived sizes

    @property
    def rotary_dim(self) -> int:
        """Dims of each attention head that RoPE rotates (head_dim * partial_rotary_factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the DeltaNet causal conv: [q nk*dk | k nk*dk | v nv*dv]."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_full_attention(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL_ATTENTION

    # ------------------------------------------------------------------ quantization

    @cached_property
    def quant_override_map(self) -> dict:
        """``quant_overrides`` as a dict: module path -> Quant or None."""
        return dict(self.quant_overrides)

    def quant_for(self, module_path: str, in_features: int | None = None):
        """The Quant the config gives module ``module_path``, or None if it stays float.

        A per-module override wins over the folder default. With ``in_features``, a
        default that does not divide the input size gives None: mlx-lm's converter leaves
        such modules unquantized without recording them.
        """
        if module_path in self.quant_override_map:
            return self.quant_override_map[module_path]
        q = self.quant_default
        if q is not None and in_features is not None and in_features % q[1] != 0:
            return None
        return q

    def dims(self) -> dict:
        """Plain-dict view of every size the engine needs (no functions, no nesting beyond lists)."""
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_conv_dim": self.linear_conv_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
            "rotary_dim": self.rotary_dim,
            "layer_types": list(self.layer_types),
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_ids": list(self.eos_token_ids),
            "max_position_embeddings": self.max_position_embeddings,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "norm_topk_prob": self.norm_topk_prob,
            "mrope_section": list(self.mrope_section) or [0, 0, 0],
        }

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "ModelConfig":
        """Reads ``config.json`` (required) and ``generation_config.json`` (optional) of a folder."""
        folder = os.fspath(path)
        config_path = os.path.join(folder, "config.json")
        if os.path.isfile(folder):
            raise ConfigError(f"[config] {folder} is a file; give the checkpoint folder that holds config.json, "
                              "the *.safetensors shards and the tokenizer")
        if not os.path.isdir(folder):
            raise ConfigError(f"[config] checkpoint folder {folder} does not exist")
        if not os.path.isfile(config_path):
            raise ConfigError(f"[config] {config_path} is missing")
        raw = _read_json(config_path)
        generation = None
        gen_path = os.path.join(folder, "generation_config.json")
        if os.path.isfile(gen_path):
            generation = _read_json(gen_path)
        return cls.from_dict(raw, generation_config=generation, source=config_path)

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        generation_config: Mapping[str, Any] | None = None,
        source: str = "config.json",
    ) -> "ModelConfig":
        """Parses a config.json dict (and optionally a generation_config.json dict)."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"[config] {source}: top level must be a JSON object, got {type(raw).__name__}")
        p = Fields(raw, source)

        model_type = raw.get("model_type")
        if model_type not in _MODEL_TYPES:
            hint = ""
            if model_type == "qwen3_5_text":
                hint = " (a text-only export; mlx-lm conversions name the folder's model 'qwen3_5')"
            raise ConfigError(
                f"[config] {source}: model_type {model_type!r} is not supported; expected one of "
                f"{', '.join(repr(t) for t in _MODEL_TYPES)}{hint}"
            )
        if "text_config" in raw:
            tc = raw["text_config"]
            if not isinstance(tc, Mapping):
                raise ConfigError(f"[config] {source}: text_config must be an object, got {type(tc).__name__}")
            text_type = tc.get("model_type", "qwen3_5_text")
            if text_type not in _TEXT_MODEL_TYPES:
                raise ConfigError(
                    f"[config] {source}: text_config.model_type {text_type!r} is not supported; "
                    f"expected one of {', '.join(repr(t) for t in _TEXT_MODEL_TYPES)}"
                )
            p = Fields(tc, source, prefix="text_config.", outer=raw)

        hidden = p.int("hidden_size")
        layers = p.int("num_hidden_layers")
        heads = p.int("num_attention_heads")
        head_dim = p.int("head_dim", default=None)
        if head_dim is None:
            # mlx-lm's rule when the field is absent; real Qwen3.5 configs always give it.
            if hidden % heads:
                raise ConfigError(f"[config] {source}: head_dim is absent and hidden_size {hidden} "
                                  f"is not a multiple of num_attention_heads {heads}")
            head_dim = hidden // heads

        layer_types = _layer_types(p, layers)
        theta, factor, rope_type = _rope(p)
        mrope_section = _mrope_section(p)
        tied = _tied(p)
        eos = _eos_ids(p, generation_config, source)
        quant_default, overrides = _quantization(raw, source)
        experts = p.int("num_experts", default=0, minimum=0)
        moe = experts > 0
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=p.int("intermediate_size", default=0 if moe else _MISSING, minimum=0 if moe else 1),
            vocab_size=p.int("vocab_size"),
            num_attention_heads=heads,
            num_key_value_heads=p.int("num_key_value_heads"),
            head_dim=head_dim,
            linear_num_key_heads=p.int("linear_num_key_heads"),
            linear_num_value_heads=p.int("linear_num_value_heads"),
            linear_key_head_dim=p.int("linear_key_head_dim"),
            linear_value_head_dim=p.int("linear_value_head_dim"),
            linear_conv_kernel_dim=p.int("linear_conv_kernel_dim", default=4),
            rms_norm_eps=p.float("rms_norm_eps", default=1e-6),
            rope_theta=theta,
            partial_rotary_factor=factor,
            rope_type=rope_type,
            layer_types=layer_types,
            tie_word_embeddings=tied,
            eos_token_ids=eos,
            max_position_embeddings=p.int("max_position_embeddings", default=262144),
            attention_bias=p.bool("attention_bias", default=False),
            attn_output_gate=p.bool("attn_output_gate", default=True),
            num_experts=experts,
            num_experts_per_tok=p.int("num_experts_per_tok") if moe else 0,
            moe_intermediate_size=p.int("moe_intermediate_size") if moe else 0,
            shared_expert_intermediate_size=p.int("shared_expert_intermediate_size") if moe else 0,
            norm_topk_prob=p.bool("norm_topk_prob", default=True),
            mrope_section=mrope_section,
            quant_default=quant_default,
            quant_overrides=overrides,
            source=source,
            sampling_defaults=_sampling_defaults(generation_config),
            raw=raw,
        )


def load_config(path: str | os.PathLike) -> ModelConfig:
    """``ModelConfig.from_folder(path)``."""
    return ModelConfig.from_folder(path)


def check_supported(config: ModelConfig) -> None:
    """Raises ConfigError when the model needs something the kernels are not specialised for.

    The attention kernels assume head_dim 256, the DeltaNet kernels d_k = d_v = 128 and a
    conv kernel of 4; attention uses an output gate and no biases; MoE routing (moe.metal)
    takes up to MAX_EXPERTS experts and MAX_EXPERTS_PER_TOKEN of them per token.
    """
    src = config.source

    def need(ok: bool, field_name: str, value, want: str) -> None:
        if not ok:
            raise ConfigError(f"[config] {src}: {field_name} = {value!r} is not supported ({want})")

    need(config.head_dim == 256, "head_dim", config.head_dim, "the attention kernels need 256")
    need(config.linear_key_head_dim == 128, "linear_key_head_dim", config.linear_key_head_dim,
         "the DeltaNet kernels need 128")
    need(config.linear_value_head_dim == 128, "linear_value_head_dim", config.linear_value_head_dim,
         "the DeltaNet kernels need 128")
    need(config.linear_conv_kernel_dim == 4, "linear_conv_kernel_dim", config.linear_conv_kernel_dim,
         "the DeltaNet conv kernel needs 4")
    need(config.num_attention_heads % config.num_key_value_heads == 0, "num_key_value_heads",
         config.num_key_value_heads, f"must divide num_attention_heads {config.num_attention_heads}")
    need(config.linear_num_value_heads % config.linear_num_key_heads == 0, "linear_num_key_heads",
         config.linear_num_key_heads, f"must divide linear_num_value_heads {config.linear_num_value_heads}")
    rot = config.rotary_dim
    need(0 < rot <= config.head_dim and rot % 2 == 0, "partial_rotary_factor", config.partial_rotary_factor,
         f"gives {rot} rotary dims; need an even number in 2..{config.head_dim}")
    need(config.rope_type == "default", "rope_parameters.rope_type", config.rope_type,
         "only plain RoPE ('default') is implemented")
    need(not config.attention_bias, "attention_bias", config.attention_bias, "attention without biases only")
    need(config.attn_output_gate, "attn_output_gate", config.attn_output_gate, "the gated attention only")
    if config.is_moe:
        need(config.num_experts <= MAX_EXPERTS, "num_experts", config.num_experts,
             f"the MoE router kernel takes up to {MAX_EXPERTS}")
        need(config.num_experts_per_tok <= min(config.num_experts, MAX_EXPERTS_PER_TOKEN), "num_experts_per_tok",
             config.num_experts_per_tok,
             f"at most num_experts = {config.num_experts} and at most {MAX_EXPERTS_PER_TOKEN}")
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            need(getattr(config, name) % 4 == 0, name, getattr(config, name), "a multiple of 4")


# ---------------------------------------------------------------------------- helpers


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read()
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"[config] {path} is not valid JSON: {e}") from None
    except OSError as e:
        raise ConfigError(f"[config] cannot read {path}: {e}") from None


_MISSING = object()


class Fields:
    """Typed access to one JSON object's fields; errors name file and field."""

    def __init__(self, d: Mapping[str, Any], source: str, prefix: str = "", outer: Mapping[str, Any] | None = None):
        self.d, self.source, self.prefix, self.outer = d, source, prefix, outer

    def get(self, name: str, default=_MISSING, *, outer_too: bool = False):
        if name in self.d and self.d[name] is not None:
            return self.d[name]
        if outer_too and self.outer is not None and self.outer.get(name) is not None:
            return self.outer[name]
        if default is _MISSING:
            raise ConfigError(f"[config] {self.source}: required field {self.prefix}{name} is missing")
        return default

    def int(self, name: str, default=_MISSING, minimum: int = 1):
        v = self.get(name, default)
        if v is None:
            return None
        # JSON has one number type: accept 4.0 but not 4.5, never a bool.
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"[config] {self.source}: {self.prefix}{name} must be an integer, got {v!r}")
        if v < minimum:
            raise ConfigError(f"[config] {self.source}: {self.prefix}{name} = {v} must be >= {minimum}")
        return v

    def float(self, name: str, default=_MISSING):
        v = self.get(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"[config] {self.source}: {self.prefix}{name} must be a positive number, got {v!r}")
        return float(v)

    def bool(self, name: str, default=_MISSING):
        v = self.get(name, default)
        if not isinstance(v, bool):
            raise ConfigError(f"[config] {self.source}: {self.prefix}{name} must be true or false, got {v!r}")
        return v


def _layer_types(p: Fields, layers: int) -> tuple[str, ...]:
    types = p.get("layer_types", None)
    if types is None:
        interval = p.int("full_attention_interval", default=4)
        return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers))
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError(
            f"[config] {p.source}: {p.prefix}layer_types must be a list of num_hidden_layers = {layers} "
            f"entries, got {types!r}"
        )
    for i, t in enumerate(types):
        if t not in _LAYER_TYPES:
            raise ConfigError(
                f"[config] {p.source}: {p.prefix}layer_types[{i}] = {t!r} is not one of "
                f"{', '.join(repr(x) for x in _LAYER_TYPES)}"
            )
    return tuple(types)


def _rope(p: Fields) -> tuple[float, float, str]:
    """rope_theta, partial_rotary_factor and the RoPE type.

    Hugging Face (transformers >= 5) and mlx-lm read them from ``rope_parameters``;
    older exports put ``rope_theta``/``partial_rotary_factor`` flat with an optional
    ``rope_scaling`` dict. The nested value wins when both are present.
    """
    nested = p.get("rope_parameters", None)
    if nested is None:
        nested = p.get("rope_scaling", None)
        where = "rope_scaling"
    else:
        where = "rope_parameters"
    if nested is not None and not isinstance(nested, Mapping):
        raise ConfigError(f"[config] {p.source}: {p.prefix}{where} must be an object, got {nested!r}")
    nested = nested or {}
    n = Fields(nested, p.source, prefix=f"{p.prefix}{where}.")
    if "rope_theta" in nested:
        theta = n.float("rope_theta")
    else:
        theta = p.float("rope_theta", default=10_000_000.0)
    if "partial_rotary_factor" in nested:
        factor = n.float("partial_rotary_factor")
    else:
        factor = p.float("partial_rotary_factor", default=0.25)
    if factor > 1:
        raise ConfigError(f"[config] {p.source}: partial_rotary_factor = {factor} must be <= 1")
    rope_type = nested.get("rope_type", nested.get("type", "default")) or "default"
    if not isinstance(rope_type, str):
        raise ConfigError(f"[config] {p.source}: {p.prefix}{where}.rope_type must be a string, got {rope_type!r}")
    return theta, factor, rope_type


def _mrope_section(p: Fields) -> tuple[int, ...]:
    """rope_parameters.mrope_section (or rope_scaling's): three non-negative pair counts, or ()."""
    nested = p.get("rope_parameters", None) or p.get("rope_scaling", None) or {}
    section = nested.get("mrope_section") if isinstance(nested, Mapping) else None
    if section is None:
        return ()
    if (not isinstance(section, (list, tuple)) or len(section) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in section)):
        raise ConfigError(f"[config] {p.source}: {p.prefix}rope_parameters.mrope_section must be three "
                          f"non-negative integers, got {section!r}")
    return tuple(section)


def _tied(p: Fields) -> bool:
    # Qwen3.5 configs carry it both at the top and in text_config; mlx-lm reads the
    # text_config one, so that one wins. The checkpoint loader cross-checks with lm_head.
    v = p.get("tie_word_embeddings", False, outer_too=True)
    if not isinstance(v, bool):
        raise ConfigError(f"[config] {p.source}: {p.prefix}tie_word_embeddings must be true or false, got {v!r}")
    return v


def _id_list(value, where: str) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"[config] {where}: eos_token_id must be a non-negative integer or a list of them, "
                              f"got {value!r}")
    return list(items)


def _sampling_defaults(generation_config: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric sampling fields of generation_config.json; ``do_sample: false`` means greedy
    (as transformers reads it)."""
    found = generation_config if isinstance(generation_config, Mapping) else {}
    out = {k: found[k] for k in sampling.FIELDS
           if isinstance(found.get(k), (int, float)) and not isinstance(found[k], bool)}
    if found.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def _eos_ids(p: Fields, generation: Mapping[str, Any] | None, source: str) -> tuple[int, ...]:
    """Union of the eos ids of generation_config.json (first: generation uses those), config.json's
    top level (where mlx-lm's converter copies them) and text_config."""
    ids: list[int] = []
    if generation is not None:
        if not isinstance(generation, Mapping):
            raise ConfigError(f"[config] generation_config.json beside {source}: top level must be an object")
        gen_source = os.path.join(os.path.dirname(source), "generation_config.json")
        ids += _id_list(generation.get("eos_token_id"), gen_source)
    if p.outer is not None:
        ids += _id_list(p.outer.get("eos_token_id"), source)
    ids += _id_list(p.d.get("eos_token_id"), source)
    return tuple(dict.fromkeys(ids))


def _quant_entry(value, where: str, source: str):
    """One quantization dict -> Quant; errors name the module (``where``)."""
    if value is False:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"[config] {source}: quantization entry for {where} must be an object or false, "
                          f"got {value!r}")
    mode = value.get("mode")
    bits, group = value.get("bits"), value.get("group_size")
    if mode in FP_MODES:
        if (bits, group) != FP_MODES[mode] or isinstance(bits, bool) or isinstance(group, bool):
            raise ConfigError(f"[config] {source}: quantization mode {mode!r} for {where} has bits = {bits!r}, "
                              f"group_size = {group!r}; {mode} is {FP_MODES[mode][0]}-bit with group size "
                              f"{FP_MODES[mode][1]}")
        return Quant(int(bits), int(group), mode)
    if mode not in (None, "affine"):
        raise ConfigError(f"[config] {source}: quantization mode {mode!r} for {where} is not supported "
                          f"(supported: affine, {', '.join(FP_MODES)})")
    if mode is None and (bits, group) in FP_MODES.values():
        return Quant(int(bits), int(group), None)  # the scales' dtype tells (checkpoint validation)
    if bits not in SUPPORTED_BITS or isinstance(bits, bool):
        raise ConfigError(f"[config] {source}: quantization bits = {bits!r} for {where} is not supported "
                          f"(supported: {', '.join(map(str, SUPPORTED_BITS))})")
    if group not in SUPPORTED_GROUP_SIZES or isinstance(group, bool):
        raise ConfigError(f"[config] {source}: quantization group_size = {group!r} for {where} is not supported "
                          f"(supported: {', '.join(map(str, SUPPORTED_GROUP_SIZES))})")
    return Quant(int(bits), int(group), mode)


def _quantization(raw: Mapping[str, Any], source: str):
    """The folder default and the per-module overrides of config.json's ``quantization``.

    mlx-lm writes ``{"group_size": g, "bits": b, "mode": "affine", <module path>: {...} | false, ...}``
    (and a copy under ``quantization_config``). Keys that are not dicts/false and not the
    three scalars are ignored, as mlx-lm does; so are entries outside ``language_model.``
    (a multimodal conversion's vision tower), which the text model never uses.
    """
    q = raw.get("quantization")
    if q is None:
        q = raw.get("quantization_config")
        if isinstance(q, Mapping) and "quant_method" in q:
            raise ConfigError(f"[config] {source}: quantization_config.quant_method {q['quant_method']!r} is not "
                              f"supported (only MLX quantization: affine, mxfp4, nvfp4, mxfp8)")
    if q is None:
        return None, ()
    if not isinstance(q, Mapping):
        raise ConfigError(f"[config] {source}: quantization must be an object, got {q!r}")
    default = _quant_entry({k: q[k] for k in ("bits", "group_size", "mode") if k in q}, "the folder default", source)
    overrides = []
    for key, value in q.items():
        if key in ("bits", "group_size", "mode"):
            continue
        if (isinstance(value, Mapping) or value is False) and key.startswith("language_model."):
            overrides.append((key, _quant_entry(value, key, source)))
    return default, tuple(sorted(overrides))
