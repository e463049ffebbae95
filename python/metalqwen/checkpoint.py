"""Reading and validating an MLX-format Qwen3.5 checkpoint folder, without torch or mlx.

``load_checkpoint(folder)`` parses config.json, reads only the JSON header of each
safetensors shard, checks every tensor the model needs against the config (name,
dtype, shape, quantization) and returns a ``Checkpoint``. Its ``describe()`` is the
plain description the engine consumes: sizes plus, per tensor, the file, the absolute
byte offset, the byte count, dtype, shape and (bits, group size, mode). No tensor data is
read here; ``Checkpoint.array`` maps one lazily for tests. The folder's tensor names and
layout are described in checkpoint_layout.py, the safetensors files in shards.py.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from . import hub
from .checkpoint_checks import Validator, is_wide, norm_median, take_layer
from .checkpoint_layout import (CONVENTION_HOW, IGNORED_PREFIXES, LM, MODEL, MTP_PREFIXES, SHIFTED_NORMS, Linear,
                                global_spec, norm_convention)
from .config import CheckpointError, ConfigError, ModelConfig, Quant, check_supported
from .mtp_checkpoint import mtp_head, sidecar_tensors
from .shards import ShardInfo, TensorInfo, index_map, read_safetensors_header, shard_files, tensor_view
from .vision_checkpoint import VisionConfig, vision_tower

__all__ = ["Checkpoint", "CheckpointError", "ConfigError", "ShardInfo", "TensorInfo", "load_checkpoint",
           "read_safetensors_header", "tensor_view"]


class Checkpoint:
    """A validated MLX Qwen3.5 checkpoint folder.

    ``config``: the ModelConfig; ``tensors``: name -> TensorInfo of every tensor the model
    uses (with bits/group_size on quantized ones); ``files``: the shards; ``mtp``: the validated
    multi-token-prediction head if the folder has one (mtp_checkpoint.py; names ``mtp.*``, empty if none);
    ``vision_config`` and ``vision``: the validated vision tower as mlx-vlm writes it
    (vision_checkpoint.py; ``vision_tower.*``), None and empty for text-only folders;
    ``ignored``: recognised tensors deliberately unused (vision towers in other layouts);
    ``unknown``: the rest, reported once with warnings.warn and never used.
    """

    def __init__(self, path: str, config: ModelConfig, tensors: dict[str, TensorInfo], files: list[ShardInfo],
                 mtp: dict[str, TensorInfo], ignored: list[str], unknown: list[str], name: str | None = None,
                 vision_config: VisionConfig | None = None, vision: dict[str, TensorInfo] | None = None):
        self.path, self.config, self.tensors, self.files = path, config, tensors, files
        self.name = name or os.path.basename(os.path.normpath(path))  # the Hub id it came from, else the folder's name
        self.mtp, self.ignored, self.unknown = mtp, ignored, unknown
        self.vision_config, self.vision = vision_config, vision or {}
        self._maps: dict[str, np.memmap] = {}

    def __repr__(self) -> str:
        c = self.config
        return (f"Checkpoint({self.path!r}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
                f"{len(self.tensors)} tensors in {len(self.files)} file(s))")

    def layer_prefix(self, i: int) -> str:
        return f"{MODEL}layers.{i}."

    def describe(self) -> dict:
        """The plain description the engine consumes (only str/int/float/bool/None/list/tuple/dict).

        ``{"path", "dims": ModelConfig.dims(), "files": [{"path", "size", "data_start"}],
           "tensors": {full name: entry},            # every tensor the model uses, flat
           "globals": {full name: entry},            # the same, outside the layers
           "layers": [{"index", "type", "prefix", "tensors": {name relative to prefix: entry}}],
           "mtp": {mtp.* name: entry},               # the MTP head, whatever prefix the folder used; may be empty
           "vision": {"dims": VisionConfig.dims(), "tensors": {vision_tower.* name: entry}} or None}``
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
        globals_ = {n: t.entry() for n, t in sorted(self.tensors.items()) if not n.startswith(MODEL + "layers.")}
        return {
            "path": self.path,
            "dims": self.config.dims(),
            "files": [{"path": f.path, "size": f.size, "data_start": f.data_start} for f in self.files],
            "tensors": {n: t.entry() for n, t in sorted(self.tensors.items())},
            "globals": globals_,
            "layers": layers,
            "mtp": {n: t.entry() for n, t in sorted(self.mtp.items())},
            "vision": None if self.vision_config is None else {
                "dims": self.vision_config.dims(), "tensors": {n: t.entry() for n, t in sorted(self.vision.items())}},
        }

    def quant(self, module: str) -> Quant | None:
        """Quant(bits, group_size, mode) of a linear/embedding module as stored, or None if it is float."""
        t = self.tensors.get(module + ".weight") or self.mtp.get(module + ".weight")
        if t is None:
            raise KeyError(module)
        return None if t.bits is None else Quant(t.bits, t.group_size, t.mode)

    def array(self, name: str) -> np.ndarray:
        """A read-only view of one tensor's bytes, memory-mapped on first use (bf16 as uint16)."""
        t = self.tensors.get(name) or self.mtp.get(name) or self.vision.get(name)
        if t is None:
            raise KeyError(f"{name} is not a tensor of {self.path}")
        m = self._maps.get(t.file)
        if m is None and t.nbytes:
            m = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return tensor_view(t, m)


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
    files = shard_files(folder)
    for file in files:
        found, shard = read_safetensors_header(file)
        shards.append(shard)
        for name, t in found.items():
            if name in tensors:
                raise CheckpointError(f"[checkpoint] tensor {name} is in both {tensors[name].file} and {file}")
            tensors[name] = t
    weight_map = index_map(folder)
    if weight_map is not None:
        index = os.path.join(folder, "model.safetensors.index.json")
        for name, file in weight_map.items():
            t = tensors.get(name)
            if t is None or os.path.basename(t.file) != file:
                raise CheckpointError(f"[checkpoint] {os.path.join(folder, file)}: tensor {name}: listed in {index} "
                                      f"but not in that file")

    if not any(n.startswith(MODEL) for n in tensors) and any(n.startswith("model.language_model.") for n in tensors):
        raise CheckpointError(f"[checkpoint] {folder}: this is a Hugging Face-format checkpoint (tensor names under "
                              f"model.language_model.*); convert it with mlx_lm.convert first")

    v = Validator(config, tensors)
    for item in global_spec(config):
        if isinstance(item, Linear):
            v.linear(item, item.module)
        else:
            v.vector(item, item.name)
    if config.tie_word_embeddings:
        extra = [n for n in tensors if n.startswith(LM + "lm_head.")]
        if extra:
            v.fail(extra[0], f"present, but {os.path.basename(config.source)} says tie_word_embeddings = true")
    for i in range(config.num_hidden_layers):
        prefix = f"{MODEL}layers.{i}."
        take_layer(v, config, prefix, config.is_full_attention(i))
        if not config.is_full_attention(i):
            d = prefix + "linear_attn."
            v.check_widths([d + "conv1d.weight", d + "dt_bias"])
            if is_wide(v.used[d + "conv1d.weight"].dtype):  # no f32-conv kernel takes a bf16 A_log
                v.check_widths([d + "conv1d.weight", d + "A_log"], " (A_log may be f32 with bf16 conv weights, "
                                                                   "not bf16 with f16/f32 ones)")

    vision_config, vision = vision_tower(config, tensors)
    rest = [n for n in tensors if n not in v.used and n not in vision]
    mtp = mtp_head(folder, config, {**{n: tensors[n] for n in rest if n.startswith(MTP_PREFIXES)},
                                    **sidecar_tensors(folder, [s.path for s in shards])})
    ignored = sorted(n for n in rest if n.startswith(IGNORED_PREFIXES))
    unknown = sorted(n for n in rest if not n.startswith(MTP_PREFIXES + IGNORED_PREFIXES))
    if unknown:
        shown = ", ".join(unknown[:20]) + (f", ... ({len(unknown)} in all)" if len(unknown) > 20 else "")
        warnings.warn(f"[checkpoint] {folder}: ignoring {len(unknown)} tensor(s) the model does not use: {shown}",
                      stacklevel=2)
    _check_norm_shift(folder, v.used)
    return Checkpoint(folder, config, v.used, shards, mtp, ignored, unknown, model_name, vision_config, vision)


def _check_norm_shift(folder: str, used: dict[str, TensorInfo]) -> None:
    """Refuses trunk norms stored in any convention but MLX's 1 + w (see norm_convention)."""
    norms = [t for n, t in used.items() if n.endswith(SHIFTED_NORMS)]
    median = norm_median(norms)
    how = norm_convention(median)
    if how == "shifted":
        return
    raise CheckpointError(f"[checkpoint] {folder}: the RMSNorm weights (e.g. {norms[0].name} in {norms[0].file}) "
                          f"have median {median:.2f}, expected about 1: they look {CONVENTION_HOW[how]}. Convert "
                          f"the original again with mlx_lm.convert or metalqwen convert")
