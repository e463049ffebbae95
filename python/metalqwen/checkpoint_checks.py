"""Checking a folder's tensors against the layout (checkpoint_layout.py): ``Validator`` takes
each tensor a module needs, by name, dtype, shape and quantization, and fails naming the file
and tensor; ``norm_median`` reads the values that tell a norm convention apart."""

from __future__ import annotations

import os

import numpy as np

from .checkpoint_layout import FLOAT_LINEAR_DTYPES, SCALE_DTYPES, Linear, Vector, layer_spec
from .config import (FP_MODES, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES, WIDE_SCALE_GROUPS, CheckpointError, ModelConfig,
                     Quant)
from .demo_checkpoint import bf16_to_f32
from .shards import TensorInfo, tensor_view

__all__ = ["Validator", "is_wide", "norm_median", "take_layer"]


class Validator:
    def __init__(self, cfg: ModelConfig, tensors: dict[str, TensorInfo]):
        self.cfg, self.tensors = cfg, tensors
        self.used: dict[str, TensorInfo] = {}

    def fail(self, name: str, message: str):
        t = self.tensors.get(name)
        where = t.file if t is not None else os.path.dirname(self.cfg.source)
        raise CheckpointError(f"[checkpoint] {where}: tensor {name}: {message}")

    def take(self, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...], bits=None, group=None, mode=None,
             why=""):
        t = self.tensors.get(name)
        if t is None:
            self.fail(name, f"missing (expected {'/'.join(dtypes)} {list(shape)}{why})")
        if t.dtype not in dtypes:
            self.fail(name, f"dtype {t.dtype}, expected {' or '.join(dtypes)}{why}")
        if t.shape != tuple(shape):
            self.fail(name, f"shape {list(t.shape)}, expected {list(shape)}{why}")
        info = TensorInfo(t.name, t.file, t.offset, t.nbytes, t.dtype, t.shape, bits, group, mode)
        self.used[name] = info
        return info

    def vector(self, v: Vector, name: str):
        hint = ""
        if name.endswith("conv1d.weight"):
            t = self.tensors.get(name)
            if t is not None and t.shape == (v.shape[0], 1, v.shape[1]):
                hint = " (this is the Hugging Face [C, 1, K] layout: convert the model with mlx_lm.convert)"
        self.take(name, v.dtypes, v.shape, why=hint)

    def linear(self, lin: Linear, module: str):
        """Validates one linear (or embedding) module; returns its Quant or None (float).

        The quantization is resolved as mlx-lm's loader does: a per-module entry in
        config.json wins; otherwise a module with ``scales`` is quantized with the
        (bits, group) its shapes imply and the folder's mode, and one without stays float.
        MoE experts (``lin.experts``) carry a leading [experts] axis on every tensor.
        """
        out, inp = lin.out_features, lin.in_features
        stack = (lin.experts,) if lin.experts else ()
        overrides = self.cfg.quant_override_map
        has_scales = module + ".scales" in self.tensors
        if module in overrides:
            q = overrides[module]
            why = f" (config.json quantization[{module!r}] = {'false' if q is None else dict(q._asdict())})"
        elif has_scales:
            q = self._inferred(module, inp, len(stack) + 2)
            why = ""
        elif module + ".weight" not in self.tensors:
            q, why = self.cfg.quant_for(module, inp), ""  # missing: report what config.json implies
        else:
            q, why = None, ""
            if self.tensors[module + ".weight"].dtype == "U32":
                self.fail(module + ".scales", "missing (the module's U32 weight is quantized)")
        if q is None:
            if has_scales or module + ".biases" in self.tensors:
                self.fail(module + ".scales", "present, but the module is float" + why)
            self.take(module + ".weight", FLOAT_LINEAR_DTYPES, (*stack, out, inp), why=why)
            return None
        bits, group, mode = q
        if mode is None:
            mode = self._undeclared_mode(module, bits, group)
            if group not in SUPPORTED_GROUP_SIZES:
                self.fail(module + ".scales", f"affine group size {group} is not supported "
                                              f"(supported: {', '.join(map(str, SUPPORTED_GROUP_SIZES))})" + why)
        mode_why = "" if mode == "affine" else f" in mode {mode}"
        self.take(module + ".weight", ("U32",), (*stack, out, inp * bits // 32), bits, group, mode,
                  why=f" for {bits}-bit{mode_why}" + why)
        if mode == "affine":
            for part in ("scales", "biases"):
                self.take(f"{module}.{part}", SCALE_DTYPES, (*stack, out, inp // group), bits, group, mode,
                          why=f" for group {group}" + why)
            self.check_widths([module + ".scales", module + ".biases"])
            if is_wide(self.used[module + ".scales"].dtype) and group not in WIDE_SCALE_GROUPS:
                self.fail(module + ".scales", f"{self.used[module + '.scales'].dtype} scales with group {group}: "
                                              f"the kernels take f16/f32 scales with group "
                                              f"{', '.join(map(str, WIDE_SCALE_GROUPS))} only (bf16 scales with "
                                              f"any group; mlx_lm.convert --dtype bfloat16 writes those)")
        else:
            self.take(module + ".scales", ("U8",), (*stack, out, inp // group), bits, group, mode,
                      why=f" ({mode} scales, group {group})" + why)
            if module + ".biases" in self.tensors:
                self.fail(module + ".biases", f"present, but {mode} quantization has no biases" + why)
        return Quant(bits, group, mode)

    def check_widths(self, names: list[str], why: str = "") -> None:
        """Tensors one kernel reads together must all be bf16 or all f16/f32 (read as f32)."""
        dtypes = [self.used[n].dtype for n in names]
        if len({is_wide(d) for d in dtypes}) > 1:
            self.fail(names[-1], f"dtype {dtypes[-1]}, but {names[0]} is {dtypes[0]}: the kernels read these "
                                 f"together, all bf16 or all f16/f32{why}")

    def _undeclared_mode(self, module: str, bits: int, group: int) -> str:
        """A module whose config.json entry names no mode is affine (as mlx-lm reads it),
        unless its scales are uint8: those are a microscaling FP mode config.json must declare."""
        s = self.tensors.get(module + ".scales")
        if s is None or s.dtype != "U8":
            return "affine"
        guess = [m for m, bg in FP_MODES.items() if bg == (bits, group)]
        which = f'"mode": "{guess[0]}"' if guess else f'a "mode" ({", ".join(FP_MODES)})'
        self.fail(module + ".scales", f"uint8 scales ({bits}-bit, group {group}) but config.json's quantization "
                                      f"declares no mode: these are not affine scales; add {which} to "
                                      f"config.json's \"quantization\" (and \"quantization_config\")")

    def _inferred(self, module: str, inp: int, ndim: int) -> Quant:
        """The Quant of a module config.json does not list: (bits, group) from its shapes (``ndim``
        axes: 3 for stacked experts), the folder's mode."""
        w, s = self.tensors.get(module + ".weight"), self.tensors[module + ".scales"]
        if w is None:
            self.fail(module + ".weight", "missing (its .scales are present)")
        if w.dtype != "U32" or len(w.shape) != ndim or len(s.shape) != ndim or s.shape[-1] == 0:
            layout = "[experts, out, in*bits/32]" if ndim == 3 else "[out, in*bits/32]"
            self.fail(module + ".weight", f"{w.dtype} {list(w.shape)} with scales {list(s.shape)} is not an MLX "
                                          f"quantized weight (expected U32 {layout})")
        if (w.shape[-1] * 32) % inp or inp % s.shape[-1]:
            self.fail(module + ".weight", f"shape {list(w.shape)} with scales {list(s.shape)} does not quantize "
                                          f"{inp} input features")
        bits, group = w.shape[-1] * 32 // inp, inp // s.shape[-1]
        default = self.cfg.quant_default
        mode = default.mode if default is not None else None
        if mode is None:
            mode = self._undeclared_mode(module, bits, group)
        if mode in FP_MODES:
            if (bits, group) != FP_MODES[mode]:
                self.fail(module + ".weight", f"shape {list(w.shape)} with scales {list(s.shape)} is {bits}-bit with "
                                              f"group {group}, not the folder's {mode}")
            return Quant(bits, group, mode)
        if bits not in SUPPORTED_BITS:
            self.fail(module + ".weight", f"{bits}-bit quantization is not supported "
                                          f"(supported: {', '.join(map(str, SUPPORTED_BITS))})")
        if group not in SUPPORTED_GROUP_SIZES:
            self.fail(module + ".scales", f"group size {group} is not supported "
                                          f"(supported: {', '.join(map(str, SUPPORTED_GROUP_SIZES))})")
        return Quant(bits, group, mode)


def is_wide(dtype: str) -> bool:
    """Read as f32 by the kernels (F32, or F16 widened at load) rather than as bf16."""
    return dtype != "BF16"


def take_layer(v: "Validator", cfg: ModelConfig, prefix: str, full_attention: bool) -> None:
    """Validates one decoder layer's tensors under ``prefix``."""
    for item in layer_spec(cfg, full_attention):
        if isinstance(item, Linear):
            v.linear(item, prefix + item.module)
        else:
            v.vector(item, prefix + item.name)
    if full_attention:
        v.check_widths([prefix + "self_attn.q_norm.weight", prefix + "self_attn.k_norm.weight"])


def norm_median(norms: list[TensorInfo]) -> float:
    """The median of all the values of ``norms`` (one map per shard, not one per tensor: hundreds in large models)."""
    maps: dict[str, np.ndarray] = {}

    def values(t: TensorInfo) -> np.ndarray:
        if t.file not in maps:
            maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        a = tensor_view(t, maps[t.file])
        return (bf16_to_f32(a) if t.dtype == "BF16" else a.astype(np.float32)).ravel()

    return float(np.median(np.concatenate([values(t) for t in norms])))
