"""The vision tower of a Qwen3.5 checkpoint folder: its config (``vision_config`` in config.json)
and its tensors as mlx-vlm writes them (``vision_tower.*``), validated like the language model's.

Layout (mlx-vlm 0.7.10, models/qwen3_vl/vision.py; ``L`` = ``vision_tower.blocks.{i}.``):

    vision_tower.patch_embed.proj.weight   [hidden, T, P, P, C] (Conv3d in MLX's channels-last order)
    vision_tower.patch_embed.proj.bias     [hidden]
    vision_tower.pos_embed.weight          [num_position_embeddings, hidden] (a side x side grid; an embedding)
    L norm1/norm2 .weight/.bias            [hidden] (LayerNorm, eps 1e-6)
    L attn.qkv .weight [3 hidden, hidden] .bias [3 hidden]   (rows: q | k | v, heads inside each)
    L attn.proj .weight [hidden, hidden] .bias [hidden]
    L mlp.linear_fc1 .weight [intermediate, hidden] .bias;  L mlp.linear_fc2 .weight [hidden, intermediate] .bias
    vision_tower.merger.norm .weight/.bias [hidden]
    vision_tower.merger.linear_fc1 .weight [4 hidden, 4 hidden] .bias;  .linear_fc2 .weight [out, 4 hidden] .bias

every tensor BF16, F16 or F32; or, for the linears and the position grid, quantized as the
language model's are (``.weight`` U32 with ``.scales``/``.biases``, checkpoint_layout.py).
mlx-vlm 0.7.10's converter leaves the tower float, but its loader takes a quantized one, and
converters that quantize every module (older mlx-vlm, a custom quant_predicate) write it so;
the Conv3d patch embedding has no quantized form. Nothing is read here but config.json and the
safetensors headers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from . import _core
from .checkpoint_checks import Validator
from .checkpoint_layout import FLOAT_DTYPES, Linear, Vector
from .config import ConfigError, Fields, ModelConfig
from .shards import TensorInfo

__all__ = ["VISION_PREFIX", "VisionConfig", "vision_spec", "vision_tower"]

VISION_PREFIX = "vision_tower."
# The tower's activations (tanh GELU in the blocks' MLP, exact GELU in the merger) are fixed by
# mlx-vlm's Qwen3-VL code whatever config.json says; these are the names that agree with it.
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's sizes (config.json ``vision_config``; defaults as mlx-vlm's VisionConfig)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    layer_norm_eps: float = 1e-6
    source: str = "config.json"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:
        """The learned position grid's side (num_position_embeddings = side²)."""
        return int(round(self.num_position_embeddings ** 0.5))

    @property
    def patch_dim(self) -> int:
        """Values per patch row: C x T x P x P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merged_dim(self) -> int:
        return self.hidden_size * self.spatial_merge_size ** 2

    def dims(self) -> dict:
        """Every size the engine's tower needs, as a plain dict."""
        return {"depth": self.depth, "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_heads": self.num_heads, "out_hidden_size": self.out_hidden_size, "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size, "spatial_merge_size": self.spatial_merge_size,
                "in_channels": self.in_channels, "num_position_embeddings": self.num_position_embeddings,
                "layer_norm_eps": self.layer_norm_eps}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str, text_hidden: int) -> "VisionConfig":
        if not isinstance(raw, Mapping):
            raise ConfigError(f"[config] {source}: vision_config must be an object, got {type(raw).__name__}")
        p = Fields(raw, source, prefix="vision_config.")
        if p.get("deepstack_visual_indexes", []):
            raise ConfigError(f"[config] {source}: vision_config.deepstack_visual_indexes = "
                              f"{raw['deepstack_visual_indexes']!r}: Qwen3.5 has no DeepStack (it must be empty)")
        act = p.get("hidden_act", _TANH_GELU[0])
        if act not in _TANH_GELU:
            raise ConfigError(f"[config] {source}: vision_config.hidden_act {act!r} is not supported (the tower's "
                              f"MLP is tanh-approximate GELU: {', '.join(_TANH_GELU)})")
        c = cls(depth=p.int("depth"), hidden_size=p.int("hidden_size"), intermediate_size=p.int("intermediate_size"),
                num_heads=p.int("num_heads"), out_hidden_size=p.int("out_hidden_size"),
                patch_size=p.int("patch_size", default=14), temporal_patch_size=p.int("temporal_patch_size", default=2),
                spatial_merge_size=p.int("spatial_merge_size", default=2), in_channels=p.int("in_channels", default=3),
                num_position_embeddings=p.int("num_position_embeddings", default=2304),
                layer_norm_eps=p.float("layer_norm_eps", default=1e-6), source=source)

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"[config] {source}: vision_config: {what}")

        need(c.hidden_size % c.num_heads == 0, f"hidden_size {c.hidden_size} is not a multiple of num_heads "
                                               f"{c.num_heads}")
        need(c.head_dim % 4 == 0 and c.head_dim <= _core.MAX_VISION_HEAD_DIM,
             f"head dim {c.head_dim} (hidden_size / num_heads) must be a multiple of 4 (the 2-D rotary) and at "
             f"most {_core.MAX_VISION_HEAD_DIM} (the attention kernel)")
        need(c.grid_side ** 2 == c.num_position_embeddings,
             f"num_position_embeddings {c.num_position_embeddings} is not a square grid")
        need(c.spatial_merge_size == 2, f"spatial_merge_size {c.spatial_merge_size}: only 2 x 2 merging is supported")
        need(c.out_hidden_size == text_hidden, f"out_hidden_size {c.out_hidden_size} differs from the language "
                                               f"model's hidden_size {text_hidden}")
        return c


def vision_spec(c: VisionConfig) -> list:
    """What the tower must hold, full names (``vision_tower.*``)."""
    H, I, P = c.hidden_size, c.intermediate_size, VISION_PREFIX

    def linear(module: str, out: int, inp: int) -> list:
        return [Linear(P + module, out, inp), Vector(P + module + ".bias", (out,))]

    def norm(module: str) -> list:
        return [Vector(P + module + ".weight", (H,)), Vector(P + module + ".bias", (H,))]

    spec: list = [
        Vector(P + "patch_embed.proj.weight", (H, c.temporal_patch_size, c.patch_size, c.patch_size, c.in_channels)),
        Vector(P + "patch_embed.proj.bias", (H,)),
        Linear(P + "pos_embed", c.num_position_embeddings, H),
    ]
    for i in range(c.depth):
        b = f"blocks.{i}."
        spec += [*norm(b + "norm1"), *norm(b + "norm2"), *linear(b + "attn.qkv", 3 * H, H),
                 *linear(b + "attn.proj", H, H), *linear(b + "mlp.linear_fc1", I, H), *linear(b + "mlp.linear_fc2", H, I)]
    M = c.merged_dim
    spec += [*norm("merger.norm"), *linear("merger.linear_fc1", M, M), *linear("merger.linear_fc2", c.out_hidden_size, M)]
    return spec


def vision_tower(config: ModelConfig, tensors: Mapping[str, TensorInfo]) -> tuple[VisionConfig | None,
                                                                                    dict[str, TensorInfo]]:
    """The folder's vision tower: (its config, its validated tensors), or (None, {}) when the folder
    has no ``vision_tower.*`` tensors (text-only conversions: mlx-lm drops the tower). Raises
    CheckpointError naming the file and tensor (or config field) at fault."""
    names = sorted(n for n in tensors if n.startswith(VISION_PREFIX))
    if not names:
        return None, {}
    folder = os.path.dirname(config.source)
    if "vision_config" not in config.raw:
        raise ConfigError(f"[checkpoint] {folder}: {len(names)} vision_tower.* tensors (e.g. {names[0]}) but "
                          f"{config.source} has no vision_config")
    vc = VisionConfig.from_dict(config.raw["vision_config"], config.source, config.hidden_size)
    v = Validator(config, dict(tensors))
    quantized = set()
    for item in vision_spec(vc):
        if isinstance(item, Linear):
            if v.linear(item, item.module) is not None:
                quantized.add(item.module)
        else:
            _patch_layout_hint(v, item, vc)
            v.take(item.name, FLOAT_DTYPES, item.shape)
            module = item.name[:-len(".bias")]
            # A float linear's kernel reads its weight and bias together (a quantized one's bias alone).
            if item.name.endswith(".bias") and module not in quantized:
                v.check_widths([module + ".weight", item.name])
    extra = [n for n in names if n not in v.used]
    if extra:
        v.fail(extra[0], f"not a tensor of a {vc.depth}-block Qwen3.5 vision tower ({len(extra)} such)")
    return vc, v.used


def _patch_layout_hint(v, item: Vector, c: VisionConfig) -> None:
    """The PyTorch [hidden, C, T, P, P] patch embedding of an unconverted folder, named as such."""
    t = v.tensors.get(item.name)
    if item.name.endswith("patch_embed.proj.weight") and t is not None and t.shape == (
            c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size) != item.shape:
        v.fail(item.name, f"shape {list(t.shape)} is PyTorch's Conv3d order [out, C, T, P, P]; the tower needs "
                          f"mlx-vlm's [out, T, P, P, C]: convert the model with mlx_vlm.convert")
