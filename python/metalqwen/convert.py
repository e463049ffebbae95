"""Hugging Face Qwen3.5 originals -> MLX folders, with numpy only, keeping the MTP head and the
vision tower.

``convert(hf_dir, out_dir)`` writes what ``mlx_lm.convert -q`` writes for the same input
(same tensor names, dtypes and values; mlx-lm loads the result) plus, unless ``mtp="drop"``,
the ``mtp.*`` tensors mlx-lm deletes, and, unless ``vision="drop"``, the vision tower as
``mlx_vlm.convert`` writes it (``vision_config`` and the image processor's files kept).
``quantize=False`` casts without quantizing (``mlx_lm.convert`` without ``-q``).
``add_mtp(hf_dir, mlx_dir)`` grafts only the MTP tensors of an original into an existing MLX
folder as the sidecar ``mtp.safetensors``, reading only the shards that hold them.

What mlx-lm does to a ``qwen3_5`` checkpoint (its models/qwen3_5.py ``sanitize``,
convert.py and utils.py ``quantize_model``/``save_config``), which this module repeats:
- names ``model.language_model.X`` -> ``language_model.model.X``, ``lm_head.weight`` ->
  ``language_model.lm_head.weight`` (dropped when the embeddings are tied);
- conv1d ``[C, 1, K]`` -> ``[C, K, 1]``;
- the zero-centred RMSNorm weights (``input_layernorm``, ``post_attention_layernorm``,
  ``model.norm``, ``q_norm``, ``k_norm``) become ``1 + w``, computed in the stored dtype;
  ``linear_attn.norm`` is a plain weight and stays;
- every float tensor but ``A_log`` is cast to the config's dtype (``torch_dtype``, else
  ``text_config.dtype``);
- every 2-D weight (linears and the embedding) whose rows are a multiple of the group
  size is quantized (MLX affine): ``weight`` U32, ``scales``/``biases`` in the float dtype.
MTP tensors are named ``mtp.*`` as in the original, quantized like the trunk, and all
their RMSNorms (``pre_fc_norm_*``, the layer's four, ``mtp.norm``) stored as ``1 + w``:
the convention of the trunk's norms in MLX folders (see shaders/README.md, MTP).
The vision tower as mlx-vlm 0.7.10 converts it (models/qwen3_5 ``sanitize_key``, qwen3_vl
vision ``sanitize``, convert.py): ``model.visual.X`` -> ``vision_tower.X``; the Conv3d patch
embedding from PyTorch's [out, C, T, P, P] to MLX's [out, T, P, P, C]; ``position_ids`` dropped;
cast to the config's dtype like the rest and never quantized (``skip_multimodal_module``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .checkpoint import CheckpointError, TensorInfo, read_safetensors_header, tensor_view
from .demo_checkpoint import bf16_bits, bf16_to_f32, quantize_affine
from .progress import ByteBar

__all__ = ["convert", "add_mtp"]

_SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                  ".q_norm.weight", ".k_norm.weight")
_MTP_SHIFTED_NORMS = _SHIFTED_NORMS + (".pre_fc_norm_embedding.weight", ".pre_fc_norm_hidden.weight",
                                       "mtp.norm.weight")
_DTYPE_TAG = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json")
# The image processor's settings, which the vision tower's preprocessing reads (vision_preprocess.py).
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
_VISION = "vision_tower."
_MAX_SHARD_BYTES = 5 << 30  # mlx-lm's shard size
_BLOCK_ROWS = 4096  # rows converted at a time: memory stays bounded for the largest tensors


# ---------------------------------------------------------------------------- float encodings


def _to_f32(tag: str, raw: np.ndarray) -> np.ndarray:
    if tag == "BF16":
        return bf16_to_f32(raw)
    if tag in ("F16", "F32"):
        return raw.astype(np.float32)
    raise CheckpointError(f"[convert] cannot convert a {tag} tensor (float tensors only)")


def _encode(tag: str, x: np.ndarray) -> np.ndarray:
    """float32 values -> the stored form of ``tag``, rounding to nearest even."""
    if tag == "BF16":
        return bf16_bits(x)
    return x.astype(np.float16 if tag == "F16" else np.float32)


# ---------------------------------------------------------------------------- the conversion plan


@dataclass(frozen=True)
class _Out:
    name: str
    tag: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * (4 if self.tag in ("U32", "F32") else 2)


@dataclass(frozen=True)
class _Job:
    """One source tensor and the tensors it becomes; ``blocks`` yields (output, first row, data)."""

    source: TensorInfo
    outputs: tuple[_Out, ...]
    blocks: Callable[[np.ndarray], Iterator[tuple[str, int, np.ndarray]]]


def _mlx_name(name: str) -> str | None:
    """The MLX name of an original's tensor (the tower's as mlx-vlm names it), or None for tensors
    no MLX folder holds."""
    for prefix in ("model.visual.", "model.language_model.visual.", "visual."):
        if name.startswith(prefix):
            return None if "position_ids" in name else _VISION + name[len(prefix):]
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name.startswith("model."):  # flat Qwen3_5ForCausalLM originals
        return "language_model.model." + name[len("model."):]
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    return name  # mtp.*


def _plan(t: TensorInfo, name: str, dtype: str | None, bits: int | None, group: int) -> _Job:
    """How ``t`` becomes ``name`` (and its scales/biases) in the MLX folder; ``dtype`` is the
    float tag everything is cast to, None to keep each tensor's own (no dtype in the config);
    ``bits`` None: nothing quantized."""
    mtp = name.startswith("mtp.")
    dtype = dtype or t.dtype
    if name.startswith(_VISION):
        bits = None  # mlx-vlm leaves the tower float
        if name.endswith("patch_embed.proj.weight") and len(t.shape) == 5 and t.shape[-1] != t.shape[1]:
            out = _Out(name, dtype, (t.shape[0], *t.shape[2:], t.shape[1]))  # [out, C, T, P, P] -> [out, T, P, P, C]
            return _Job(t, (out,), lambda a: iter([(name, 0, _encode(dtype, _to_f32(t.dtype, a)).transpose(
                0, 2, 3, 4, 1))]))
    if name.endswith("conv1d.weight") and len(t.shape) == 3:
        c, one, k = t.shape
        out = _Out(name, dtype, (c, k, one))
        return _Job(t, (out,), lambda a: iter([(name, 0, _encode(dtype, _to_f32(t.dtype, a)).reshape(out.shape))]))
    if name.endswith("A_log"):  # mlx-lm's cast predicate keeps A_log as stored
        return _Job(t, (_Out(name, t.dtype, t.shape),), lambda a: iter([(name, 0, a)]))
    if name.endswith(_MTP_SHIFTED_NORMS if mtp else _SHIFTED_NORMS) and len(t.shape) == 1:
        def shifted(a):
            # 1 + w in the stored dtype (as mlx adds before casting), then the cast.
            stored = _encode(t.dtype, _to_f32(t.dtype, a) + np.float32(1.0))
            yield name, 0, _encode(dtype, _to_f32(t.dtype, stored))
        return _Job(t, (_Out(name, dtype, t.shape),), shifted)
    if bits is not None and len(t.shape) == 2 and name.endswith(".weight") and t.shape[1] % group == 0:
        rows, cols = t.shape
        base = name[: -len(".weight")]
        outs = (_Out(name, "U32", (rows, cols * bits // 32)), _Out(base + ".scales", dtype, (rows, cols // group)),
                _Out(base + ".biases", dtype, (rows, cols // group)))
        if dtype != "BF16":
            raise CheckpointError(f"[convert] {t.file}: quantizing {dtype} weights is not supported (bf16 only)")

        def quantized(a):
            for r in range(0, rows, _BLOCK_ROWS):
                # The cast to the model's dtype comes before quantization, as in mlx-lm.
                w = bf16_to_f32(_encode(dtype, _to_f32(t.dtype, a[r: r + _BLOCK_ROWS])))
                wq, scales, biases = quantize_affine(w, bits, group)
                yield outs[0].name, r, wq
                yield outs[1].name, r, scales
                yield outs[2].name, r, biases
        return _Job(t, outs, quantized)

    def cast(a):
        for r in range(0, max(t.shape[0], 1), _BLOCK_ROWS):
            yield name, r, _encode(dtype, _to_f32(t.dtype, a[r: r + _BLOCK_ROWS]))
    return _Job(t, (_Out(name, dtype, t.shape),), cast)


# ---------------------------------------------------------------------------- reading and writing


def _write_shard(path: str, jobs: list[_Job], bar: ByteBar | None) -> None:
    """Writes one safetensors file, tensor by tensor, block by block (never a whole model in memory)."""
    outs = sorted((o for j in jobs for o in j.outputs), key=lambda o: o.name)
    header, offset = {"__metadata__": {"format": "mlx"}}, 0
    for o in outs:
        header[o.name] = {"dtype": o.tag, "shape": list(o.shape), "data_offsets": [offset, offset + o.nbytes]}
        offset += o.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    where = {o.name: (start + header[o.name]["data_offsets"][0], o) for o in outs}
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(start + offset)
        for job in jobs:
            for name, row, data in job.blocks(tensor_view(job.source)):
                base, out = where[name]
                row_bytes = out.nbytes // out.shape[0] if out.shape and out.shape[0] else 0
                f.seek(base + row * row_bytes)
                f.write(np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False).tobytes())
            if bar:
                bar.add(job.source.nbytes)
    os.replace(tmp, path)


def _write_model(out_dir: str, jobs: list[_Job], bar: ByteBar | None) -> None:
    """mlx-lm's layout: shards of at most 5 GiB in name order, and an index naming each tensor's shard."""
    jobs = sorted(jobs, key=lambda j: j.outputs[0].name)
    shards: list[list[_Job]] = []
    size = 0
    for j in jobs:
        n = sum(o.nbytes for o in j.outputs)
        if not shards or size + n > _MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(j)
        size += n
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        _write_shard(os.path.join(out_dir, name), shard, bar)
        weight_map.update({o.name: name for j in shard for o in j.outputs})
    total = sum(o.nbytes for j in jobs for o in j.outputs)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=4)


# ---------------------------------------------------------------------------- originals


def _read_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"[convert] {path}: {e}") from None
    text = config.get("text_config", config)
    if config.get("model_type") != "qwen3_5" or text.get("num_experts", 0):
        raise CheckpointError(f"[convert] {path}: model_type {config.get('model_type')!r}; metalqwen convert "
                              "handles dense Qwen3.5 originals (model_type qwen3_5)")
    if "quantization" in config or "quantization_config" in config:
        raise CheckpointError(f"[convert] {path}: this folder is already quantized; convert needs the original")
    return config


def _config_dtype(config: dict) -> str | None:
    """The float tag mlx-lm casts to: torch_dtype, else text_config's dtype; None: no cast."""
    return _DTYPE_TAG.get(config.get("torch_dtype") or config.get("text_config", {}).get("dtype"))


def _source_tensors(hf_dir: str, only_mtp: bool) -> dict[str, TensorInfo]:
    """The original's tensors by name; with ``only_mtp``, reading only the shards that hold ``mtp.*``."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = dict.fromkeys(v for k, v in weight_map.items() if not only_mtp or k.startswith("mtp."))
        if only_mtp and not files:
            raise CheckpointError(f"[convert] {index} names no mtp.* tensor: this original has no MTP head")
        paths = [os.path.join(hf_dir, f) for f in files]
    elif os.path.isfile(os.path.join(hf_dir, "model.safetensors")):
        paths = [os.path.join(hf_dir, "model.safetensors")]
    else:
        raise CheckpointError(f"[convert] {hf_dir}: neither model.safetensors.index.json nor model.safetensors")
    tensors: dict[str, TensorInfo] = {}
    for p in paths:
        found, _ = read_safetensors_header(p)
        tensors.update({k: v for k, v in found.items() if not only_mtp or k.startswith("mtp.")})
    return tensors


def _new_folder(out_dir: str) -> str:
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir):
        raise FileExistsError(f"[convert] {out_dir} already exists; give a new folder")
    os.makedirs(out_dir)
    return out_dir


def _check_quant(bits: int, group_size: int) -> None:
    if bits not in (4, 8) or group_size not in (32, 64, 128):
        raise ValueError(f"bits must be 4 or 8 and group_size 32, 64 or 128, got {bits} and {group_size}")


def convert(hf_dir: str | os.PathLike, out_dir: str | os.PathLike, bits: int = 4, group_size: int = 64,
            mtp: str = "keep", progress: bool = False, quantize: bool = True, vision: str = "keep") -> str:
    """Converts a Hugging Face Qwen3.5 original into a new MLX folder; returns its path.
    ``quantize=False``: float tensors cast to the config's dtype, none quantized (bits and
    group_size unused); ``vision="drop"``: a text-only folder, as mlx_lm.convert writes."""
    _check_quant(bits, group_size)
    for option, value in (("mtp", mtp), ("vision", vision)):
        if value not in ("keep", "drop"):
            raise ValueError(f"{option} must be 'keep' or 'drop', got {value!r}")
    hf_dir = os.fspath(hf_dir)
    config = _read_config(hf_dir)
    text = config.get("text_config", config)
    dtype = _config_dtype(config)
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    jobs = []
    for name, t in sorted(_source_tensors(hf_dir, only_mtp=False).items()):
        target = _mlx_name(name)
        if target is None or (tied and name == "lm_head.weight") or (mtp == "drop" and target.startswith("mtp.")) or (
                vision == "drop" and target.startswith(_VISION)):
            continue
        jobs.append(_plan(t, target, dtype, bits if quantize else None, group_size))
    has_tower = any(j.outputs[0].name.startswith(_VISION) for j in jobs)
    if has_tower and "vision_config" not in config:
        raise CheckpointError(f"[convert] {hf_dir}/config.json: the original has model.visual.* tensors but no "
                              "vision_config (give vision='drop' for a text-only folder)")
    out_dir = _new_folder(out_dir)
    try:
        bar = ByteBar("converting", sum(j.source.nbytes for j in jobs)) if progress else None
        _write_model(out_dir, jobs, bar)
        dropped = ("_name_or_path",) if has_tower else ("_name_or_path", "vision_config")
        config = {k: v for k, v in config.items() if k not in dropped}
        if quantize:
            quantization = {"group_size": group_size, "bits": bits, "mode": "affine"}
            config.update(quantization=quantization, quantization_config=quantization)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(dict(sorted(config.items())), f, indent=4)
        for name in _TOKENIZER_FILES + (_PROCESSOR_FILES if has_tower else ()):
            if os.path.isfile(os.path.join(hf_dir, name)):
                shutil.copy(os.path.join(hf_dir, name), out_dir)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # nothing half-written is left behind
        raise
    return out_dir


def add_mtp(hf_dir: str | os.PathLike, mlx_dir: str | os.PathLike, progress: bool = False) -> str:
    """Writes the original's MTP head into ``mlx_dir/mtp.safetensors``, quantized as the folder's
    trunk; reads only the shards the original's index names for ``mtp.*``. Returns the file."""
    hf_dir, mlx_dir = os.fspath(hf_dir), os.fspath(mlx_dir)
    _read_config(hf_dir)
    with open(os.path.join(mlx_dir, "config.json")) as f:
        mlx_config = json.load(f)
    quant = mlx_config.get("quantization")
    if not quant or quant.get("mode", "affine") != "affine":
        raise CheckpointError(f"[convert] {mlx_dir}/config.json: add-mtp needs an affine-quantized MLX folder")
    _check_quant(quant["bits"], quant["group_size"])
    target = os.path.join(mlx_dir, "mtp.safetensors")
    if os.path.exists(target):
        raise FileExistsError(f"[convert] {target} already exists")
    dtype = _config_dtype(mlx_config)
    jobs = [_plan(t, name, dtype, quant["bits"], quant["group_size"])
            for name, t in sorted(_source_tensors(hf_dir, only_mtp=True).items())]
    bar = ByteBar("adding the MTP head", sum(j.source.nbytes for j in jobs)) if progress else None
    _write_shard(target, jobs, bar)
    return target
