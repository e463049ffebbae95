"""Reading and validating an MLX-format Qwen3.5 checkpoint folder, without torch or mlx.

``load_checkpoint(folder)`` parses config.json, reads only the JSON header of each
safetensors shard, checks every tensor the model needs against the config (name,
dtype, shape, quantization) and returns a ``Checkpoint``. Its ``describe()`` is the
plain description the engine consumes: sizes plus, per tensor, the file, the absolute
byte offset, the byte count, dtype, shape and (bits, group size, mode). No tensor data is
read here; ``Checkpoint.array`` maps one lazily for tests.

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

Absolute offsets are NOT aligned in general: mlx writes the header without padding, so
data may start at any even byte. Consumers copy (or realign) rather than alias the map.
"""

from __future__ import annotations

import json
import math
import os
import struct
import warnings
from dataclasses import dataclass

import numpy as np

from .config import (FP_MODES, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES, WIDE_SCALE_GROUPS, CheckpointError, ConfigError,
                     ModelConfig, Quant, check_supported)
from . import hub
from .demo_checkpoint import bf16_to_f32

__all__ = ["Checkpoint", "CheckpointError", "ConfigError", "ShardInfo", "TensorInfo", "load_checkpoint",
           "read_safetensors_header", "tensor_view"]

# safetensors dtype tag -> element size in bytes
DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
# numpy view of each tag (bf16 as its uint16 bit patterns; little-endian as the format says)
_NUMPY_DTYPE = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "F8_E4M3": "|u1", "F8_E5M2": "|u1",
    "U16": "<u2", "I16": "<i2", "F16": "<f2", "BF16": "<u2",
    "U32": "<u4", "I32": "<i4", "F32": "<f4",
    "U64": "<u8", "I64": "<i8", "F64": "<f8",
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference reader's limit

# dtypes the engine accepts for each kind of tensor. Kernels read vectors and affine
# scales/biases as bf16 (as stored) or f32 (stored so, or F16 widened at load): tensors
# one kernel reads together must agree on that width (_check_widths).
_FLOAT = ("BF16", "F16", "F32")
_FLOAT_LINEAR = ("BF16", "F16", "F32")  # unquantized projections, embeddings, lm_head
_A_LOG = ("F32", "BF16", "F16")
_SCALES = ("BF16", "F16", "F32")


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``offset`` is absolute in ``file`` (header included)."""

    name: str
    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    bits: int | None = None
    group_size: int | None = None
    mode: str | None = None  # affine, mxfp4, nvfp4, mxfp8 (quantized modules only)
    add: float = 0.0  # added to every element at load: 1 for MTP norms stored unshifted (mtp_checkpoint.py)

    def entry(self) -> tuple:
        """(file, offset, nbytes, dtype, shape, bits, group_size, mode[, add]): the engine's view (add
        only when it is not 0)."""
        entry = (self.file, self.offset, self.nbytes, self.dtype, self.shape, self.bits, self.group_size, self.mode)
        return entry + (self.add,) if self.add else entry


@dataclass(frozen=True)
class ShardInfo:
    """One safetensors file: its size and where its data region starts (8 + header length)."""

    path: str
    size: int
    data_start: int
    metadata: dict


# ---------------------------------------------------------------------------- safetensors headers


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], ShardInfo]:
    """Parses one safetensors file's header (never its data) and checks it against the file size.

    Raises CheckpointError naming the file (and the tensor) for: a missing or unreadable
    file, a header length running past the end, bad JSON, malformed entries, unknown
    dtypes, byte counts that disagree with dtype x shape, data past the end of the file
    (truncation) and tensors whose bytes overlap.
    """
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"[checkpoint] {path}: truncated: {size} bytes, too short for the "
                                      f"8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"[checkpoint] {path}: corrupt or truncated header: header length {n} "
                                      f"runs past the end of the {size}-byte file")
            raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"[checkpoint] {path}: file is missing") from None
    except OSError as e:
        raise CheckpointError(f"[checkpoint] {path}: cannot read: {e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: expected a JSON object, "
                              f"got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"[checkpoint] {path}: corrupt header: __metadata__ must be an object")

    data_start = 8 + n
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, e in header.items():
        where = f"[checkpoint] {path}: tensor {name}"
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            raise CheckpointError(f"{where}: corrupt header entry {e!r} (needs dtype, shape, data_offsets)")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZE:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise CheckpointError(f"{where}: corrupt shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise CheckpointError(f"{where}: corrupt data_offsets {offsets!r}")
        begin, end = offsets
        if begin > end:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] are out of order")
        need = math.prod(shape) * DTYPE_SIZE[dtype]
        if end - begin != need:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes but "
                                  f"{dtype} {shape} needs {need}")
        if end > data_size:
            raise CheckpointError(f"{where}: data ends at byte {data_start + end}, past the end of the "
                                  f"{size}-byte file (truncated download?)")
        tensors[name] = TensorInfo(name, path, data_start + begin, need, dtype, tuple(shape))

    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"[checkpoint] {path}: tensors {n0} and {n1} overlap "
                                  f"(bytes {b0}..{e0} and {b1}..{e1})")
    return tensors, ShardInfo(path, size, data_start, {str(k): v for k, v in metadata.items()})


def _shard_files(folder: str) -> list[str]:
    """The weight files of a folder: from model.safetensors.index.json, else model.safetensors,
    else every *.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, "rb") as f:
                weight_map = json.loads(f.read().decode("utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError("weight_map must map tensor names to file names")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"[checkpoint] {index}: corrupt index ({e!s})") from None
        files = []
        for name in dict.fromkeys(weight_map.values()):
            p = os.path.join(folder, name)
            if os.path.dirname(os.path.normpath(name)) or not os.path.isfile(p):
                raise CheckpointError(f"[checkpoint] {index}: shard {name} (holding e.g. "
                                      f"{next(k for k, v in weight_map.items() if v == name)}) is missing")
            files.append(p)
        return files
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"[checkpoint] {folder}: no *.safetensors weight files")
    return files


def _index_map(folder: str) -> dict[str, str] | None:
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index):
        return None
    with open(index, "rb") as f:
        return json.loads(f.read().decode("utf-8"))["weight_map"]


# ---------------------------------------------------------------------------- what the model needs


@dataclass(frozen=True)
class _Linear:
    module: str  # module path, e.g. language_model.model.layers.0.mlp.down_proj
    out_features: int
    in_features: int
    experts: int = 0  # > 0: a stack of that many [out, in] matrices (MoE switch_mlp)


@dataclass(frozen=True)
class _Vector:
    name: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...] = _FLOAT


_LM = "language_model."
_MODEL = "language_model.model."


def _layer_spec(cfg: ModelConfig, full_attention: bool) -> list:
    """What a decoder layer must hold, with names relative to its prefix (``language_model.model.layers.{i}.``)."""
    H = cfg.hidden_size
    spec: list = [
        _Vector("input_layernorm.weight", (H,)),
        _Vector("post_attention_layernorm.weight", (H,)),
        *(_moe_spec(cfg) if cfg.is_moe else _mlp_spec("mlp.", H, cfg.intermediate_size)),
    ]
    if full_attention:
        nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        spec += [
            _Linear("self_attn.q_proj", nq * hd * 2, H),  # per head [query | gate]
            _Linear("self_attn.k_proj", nkv * hd, H),
            _Linear("self_attn.v_proj", nkv * hd, H),
            _Linear("self_attn.o_proj", H, nq * hd),
            _Vector("self_attn.q_norm.weight", (hd,)),
            _Vector("self_attn.k_norm.weight", (hd,)),
        ]
    else:
        nv = cfg.linear_num_value_heads
        spec += [
            _Linear("linear_attn.in_proj_qkv", cfg.linear_conv_dim, H),
            _Linear("linear_attn.in_proj_z", cfg.linear_value_dim, H),
            _Linear("linear_attn.in_proj_b", nv, H),
            _Linear("linear_attn.in_proj_a", nv, H),
            _Linear("linear_attn.out_proj", H, cfg.linear_value_dim),
            _Vector("linear_attn.conv1d.weight", (cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, 1)),
            _Vector("linear_attn.dt_bias", (nv,)),
            _Vector("linear_attn.A_log", (nv,), _A_LOG),
            _Vector("linear_attn.norm.weight", (cfg.linear_value_head_dim,)),
        ]
    return spec


def _mlp_spec(prefix: str, H: int, I: int) -> list:
    return [_Linear(prefix + "gate_proj", I, H), _Linear(prefix + "up_proj", I, H), _Linear(prefix + "down_proj", H, I)]


def _moe_spec(cfg: ModelConfig) -> list:
    """The sparse MoE block as mlx-lm names it (qwen3_next's SparseMoeBlock): router, stacked experts,
    shared expert and its gate."""
    H, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    return [
        _Linear("mlp.gate", E, H),
        _Linear("mlp.switch_mlp.gate_proj", I, H, E),
        _Linear("mlp.switch_mlp.up_proj", I, H, E),
        _Linear("mlp.switch_mlp.down_proj", H, I, E),
        *_mlp_spec("mlp.shared_expert.", H, cfg.shared_expert_intermediate_size),
        _Linear("mlp.shared_expert_gate", 1, H),
    ]


def _global_spec(cfg: ModelConfig) -> list:
    spec: list = [
        _Linear(_MODEL + "embed_tokens", cfg.vocab_size, cfg.hidden_size),
        _Vector(_MODEL + "norm.weight", (cfg.hidden_size,)),
    ]
    if not cfg.tie_word_embeddings:
        spec.append(_Linear(_LM + "lm_head", cfg.vocab_size, cfg.hidden_size))
    return spec


def _take_layer(v: "_Validator", cfg: ModelConfig, prefix: str, full_attention: bool) -> None:
    """Validates one decoder layer's tensors under ``prefix``."""
    for item in _layer_spec(cfg, full_attention):
        if isinstance(item, _Linear):
            v.linear(item, prefix + item.module)
        else:
            v.vector(item, prefix + item.name)
    if full_attention:
        v.check_widths([prefix + "self_attn.q_norm.weight", prefix + "self_attn.k_norm.weight"])


# Tensors that are recognised and deliberately not used: the vision tower of multimodal
# conversions (mlx-lm drops it too) and the MTP head (listed apart, see Checkpoint.mtp).
_IGNORED_PREFIXES = ("vision_tower.", "model.visual.", "language_model.vision_tower.")
_MTP_PREFIXES = ("mtp.", "language_model.mtp.", "language_model.model.mtp.")


class _Validator:
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

    def vector(self, v: _Vector, name: str):
        hint = ""
        if name.endswith("conv1d.weight"):
            t = self.tensors.get(name)
            if t is not None and t.shape == (v.shape[0], 1, v.shape[1]):
                hint = " (this is the Hugging Face [C, 1, K] layout: convert the model with mlx_lm.convert)"
        self.take(name, v.dtypes, v.shape, why=hint)

    def linear(self, lin: _Linear, module: str):
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
            self.take(module + ".weight", _FLOAT_LINEAR, (*stack, out, inp), why=why)
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
                self.take(f"{module}.{part}", _SCALES, (*stack, out, inp // group), bits, group, mode,
                          why=f" for group {group}" + why)
            self.check_widths([module + ".scales", module + ".biases"])
            if _wide(self.used[module + ".scales"].dtype) and group not in WIDE_SCALE_GROUPS:
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
        if len({_wide(d) for d in dtypes}) > 1:
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


def _wide(dtype: str) -> bool:
    """Read as f32 by the kernels (F32, or F16 widened at load) rather than as bf16."""
    return dtype != "BF16"


class Checkpoint:
    """A validated MLX Qwen3.5 checkpoint folder.

    ``config``: the ModelConfig; ``tensors``: name -> TensorInfo of every tensor the model
    uses (with bits/group_size on quantized ones); ``files``: the shards; ``mtp``: the validated
    multi-token-prediction head if the folder has one (mtp_checkpoint.py; names ``mtp.*``, empty if none);
    ``ignored``: recognised tensors deliberately unused (vision tower); ``unknown``: the rest,
    reported once with warnings.warn and never used.
    """

    def __init__(self, path: str, config: ModelConfig, tensors: dict[str, TensorInfo], files: list[ShardInfo],
                 mtp: dict[str, TensorInfo], ignored: list[str], unknown: list[str], name: str | None = None):
        self.path, self.config, self.tensors, self.files = path, config, tensors, files
        self.name = name or os.path.basename(os.path.normpath(path))  # the Hub id it came from, else the folder's name
        self.mtp, self.ignored, self.unknown = mtp, ignored, unknown
        self._maps: dict[str, np.memmap] = {}

    def __repr__(self) -> str:
        c = self.config
        return (f"Checkpoint({self.path!r}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
                f"{len(self.tensors)} tensors in {len(self.files)} file(s))")

    def layer_prefix(self, i: int) -> str:
        return f"{_MODEL}layers.{i}."

    def describe(self) -> dict:
        """The plain description the engine consumes (only str/int/float/bool/None/list/tuple/dict).

        ``{"path", "dims": ModelConfig.dims(), "files": [{"path", "size", "data_start"}],
           "tensors": {full name: entry},            # every tensor the model uses, flat
           "globals": {full name: entry},            # the same, outside the layers
           "layers": [{"index", "type", "prefix", "tensors": {name relative to prefix: entry}}],
           "mtp": {mtp.* name: entry}}``  (the MTP head, whatever prefix the folder used; may be empty)
        with ``entry = (file, offset, nbytes, dtype, shape, bits, group_size, mode[, add])``: absolute
        byte offset in ``file``, dtype a safetensors tag (U32, U8, BF16, F16, F32), bits,
        group_size and mode set on the weight/scales/biases of quantized modules, else None; add
        (only on MTP norms stored unshifted) is added to every element at load.
        Globals are ``language_model.model.embed_tokens.{weight,scales,biases}``,
        ``language_model.model.norm.weight`` and, when untied, ``language_model.lm_head.*``.
        The engine binding takes ``dims`` and the flat ``tensors`` (plus ``mtp`` to load the head).
        """
        layers = []
        for i, kind in enumerate(self.config.layer_types):
            prefix = self.layer_prefix(i)
            tensors = {n[len(prefix):]: t.entry() for n, t in self.tensors.items() if n.startswith(prefix)}
            layers.append({"index": i, "type": kind, "prefix": prefix, "tensors": dict(sorted(tensors.items()))})
        globals_ = {n: t.entry() for n, t in sorted(self.tensors.items()) if not n.startswith(_MODEL + "layers.")}
        return {
            "path": self.path,
            "dims": self.config.dims(),
            "files": [{"path": f.path, "size": f.size, "data_start": f.data_start} for f in self.files],
            "tensors": {n: t.entry() for n, t in sorted(self.tensors.items())},
            "globals": globals_,
            "layers": layers,
            "mtp": {n: t.entry() for n, t in sorted(self.mtp.items())},
        }

    def quant(self, module: str) -> Quant | None:
        """Quant(bits, group_size, mode) of a linear/embedding module as stored, or None if it is float."""
        t = self.tensors.get(module + ".weight") or self.mtp.get(module + ".weight")
        if t is None:
            raise KeyError(module)
        return None if t.bits is None else Quant(t.bits, t.group_size, t.mode)

    def array(self, name: str) -> np.ndarray:
        """A read-only view of one tensor's bytes, memory-mapped on first use (bf16 as uint16)."""
        t = self.tensors.get(name) or self.mtp.get(name)
        if t is None:
            raise KeyError(f"{name} is not a tensor of {self.path}")
        m = self._maps.get(t.file)
        if m is None and t.nbytes:
            m = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return tensor_view(t, m)


def tensor_view(t: TensorInfo, mapped: np.ndarray | None = None) -> np.ndarray:
    """A read-only view of one tensor's bytes (bf16 as uint16), from ``mapped`` (the whole file,
    memory-mapped) or a new map of just this tensor."""
    dtype = np.dtype(_NUMPY_DTYPE[t.dtype])
    if t.nbytes == 0:
        a = np.zeros(t.shape, dtype)
    elif mapped is not None:
        a = mapped[t.offset: t.offset + t.nbytes].view(dtype).reshape(t.shape)
    else:
        a = np.memmap(t.file, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,)).view(dtype).reshape(t.shape)
    a.flags.writeable = False
    return a


def load_checkpoint(path: str | os.PathLike, check_kernels: bool = True) -> Checkpoint:
    """Reads and validates an MLX Qwen3.5 checkpoint folder (headers only; data stays on disk),
    or a Hugging Face Hub model id's snapshot (``hub.resolve``: downloaded, or from the cache).

    With ``check_kernels`` (default) the model must also fit the kernels'
    specialisations (``config.check_supported``). Unknown extra tensors give one
    ``warnings.warn`` listing them; they are never used. Every problem raises
    CheckpointError (a ValueError) naming the file and the tensor or field.
    """
    folder, model_name = hub.resolve(path)
    config = ModelConfig.from_folder(folder)
    if check_kernels:
        check_supported(config)

    shards: list[ShardInfo] = []
    tensors: dict[str, TensorInfo] = {}
    files = _shard_files(folder)
    for file in files:
        found, shard = read_safetensors_header(file)
        shards.append(shard)
        for name, t in found.items():
            if name in tensors:
                raise CheckpointError(f"[checkpoint] tensor {name} is in both {tensors[name].file} and {file}")
            tensors[name] = t
    weight_map = _index_map(folder)
    if weight_map is not None:
        index = os.path.join(folder, "model.safetensors.index.json")
        for name, file in weight_map.items():
            t = tensors.get(name)
            if t is None or os.path.basename(t.file) != file:
                raise CheckpointError(f"[checkpoint] {os.path.join(folder, file)}: tensor {name}: listed in {index} "
                                      f"but not in that file")

    if not any(n.startswith(_MODEL) for n in tensors) and any(n.startswith("model.language_model.") for n in tensors):
        raise CheckpointError(f"[checkpoint] {folder}: this is a Hugging Face-format checkpoint (tensor names under "
                              f"model.language_model.*); convert it with mlx_lm.convert first")

    v = _Validator(config, tensors)
    for item in _global_spec(config):
        if isinstance(item, _Linear):
            v.linear(item, item.module)
        else:
            v.vector(item, item.name)
    if config.tie_word_embeddings:
        extra = [n for n in tensors if n.startswith(_LM + "lm_head.")]
        if extra:
            v.fail(extra[0], f"present, but {os.path.basename(config.source)} says tie_word_embeddings = true")
    for i in range(config.num_hidden_layers):
        prefix = f"{_MODEL}layers.{i}."
        _take_layer(v, config, prefix, config.is_full_attention(i))
        if not config.is_full_attention(i):
            d = prefix + "linear_attn."
            v.check_widths([d + "conv1d.weight", d + "dt_bias"])
            if _wide(v.used[d + "conv1d.weight"].dtype):  # no f32-conv kernel takes a bf16 A_log
                v.check_widths([d + "conv1d.weight", d + "A_log"], " (A_log may be f32 with bf16 conv weights, "
                                                                   "not bf16 with f16/f32 ones)")

    rest = [n for n in tensors if n not in v.used]
    from .mtp_checkpoint import mtp_head, sidecar_tensors  # it builds on this module's validator
    mtp = mtp_head(folder, config, {**{n: tensors[n] for n in rest if n.startswith(_MTP_PREFIXES)},
                                    **sidecar_tensors(folder, [s.path for s in shards])})
    ignored = sorted(n for n in rest if n.startswith(_IGNORED_PREFIXES))
    unknown = sorted(n for n in rest if not n.startswith(_MTP_PREFIXES + _IGNORED_PREFIXES))
    if unknown:
        shown = ", ".join(unknown[:20]) + (f", ... ({len(unknown)} in all)" if len(unknown) > 20 else "")
        warnings.warn(f"[checkpoint] {folder}: ignoring {len(unknown)} tensor(s) the model does not use: {shown}",
                      stacklevel=2)
    _check_norm_shift(folder, v.used)
    return Checkpoint(folder, config, v.used, shards, mtp, ignored, unknown, model_name)


# The zero-centred RMSNorms (used as 1 + w) that MLX folders store shifted, as 1 + w.
_SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
                  _MODEL + "norm.weight")


def _norm_median(norms: list[TensorInfo]) -> float:
    """The median of all the values of ``norms`` (one map per shard, not one per tensor: hundreds in large models)."""
    maps: dict[str, np.ndarray] = {}

    def values(t: TensorInfo) -> np.ndarray:
        if t.file not in maps:
            maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        a = tensor_view(t, maps[t.file])
        return (bf16_to_f32(a) if t.dtype == "BF16" else a.astype(np.float32)).ravel()

    return float(np.median(np.concatenate([values(t) for t in norms])))


def _norm_convention(median: float) -> str:
    """How zero-centred norms (used as 1 + w) with this median are stored: "shifted" (1 + w, w small:
    MLX's convention, median near 1), "unshifted" (Hugging Face's w, near 0) or "twice" (1 + 1 + w, near 2)."""
    return "shifted" if 0.5 <= median <= 1.5 else "unshifted" if median < 0.5 else "twice"


_CONVENTION_HOW = {"unshifted": "not shifted (stored as Hugging Face's w instead of MLX's 1 + w)",
                   "twice": "shifted twice (1 + 1 + w, an old converter's mistake)"}


def _check_norm_shift(folder: str, used: dict[str, TensorInfo]) -> None:
    """Refuses trunk norms stored in any convention but MLX's 1 + w (see _norm_convention)."""
    norms = [t for n, t in used.items() if n.endswith(_SHIFTED_NORMS)]
    median = _norm_median(norms)
    how = _norm_convention(median)
    if how == "shifted":
        return
    raise CheckpointError(f"[checkpoint] {folder}: the RMSNorm weights (e.g. {norms[0].name} in {norms[0].file}) "
                          f"have median {median:.2f}, expected about 1: they look {_CONVENTION_HOW[how]}. Convert "
                          f"the original again with mlx_lm.convert or metalqwen convert")
