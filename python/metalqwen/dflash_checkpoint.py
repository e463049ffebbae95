"""A DFlash drafter folder (issue 28: z-lab's block-diffusion drafters, as dflash-mlx and mlx-vlm
load them), read and checked against the target it drafts for.

The folder: ``config.json`` (``architectures: ["DFlashDraftModel"]``, ``model_type: qwen3``,
Qwen3 sizes, ``block_size``, ``num_target_layers`` and ``dflash_config`` holding
``target_layer_ids`` and ``mask_token_id``) and safetensors whose names have no ``model.``
prefix (one is stripped where present, as mlx-vlm's sanitize does): ``fc.weight [H, n·H]``
(n = len(target_layer_ids)), ``hidden_norm.weight``, ``layers.N.{input_layernorm,
post_attention_layernorm}.weight``, ``layers.N.self_attn.{q,k,v,o}_proj.weight``,
``layers.N.self_attn.{q,k}_norm.weight``, ``layers.N.mlp.{gate,up,down}_proj.weight``,
``norm.weight``; unquantized. It has no embedding or lm_head: the target's are used. Its RMSNorms
multiply by w as stored, its RoPE is split-half over the whole head (the math: docs/speculative.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .config import CheckpointError, ModelConfig
from .shards import TensorInfo, read_safetensors_header, shard_files

__all__ = ["Drafter", "load_drafter", "MAX_HEAD_DIM"]

# The drafter's attention kernels hold a head in registers, 32 dims a lane step, both halves of
# each RoPE pair in one lane: head dims that are multiples of 64 up to this (shaders/params/dflash.h).
MAX_HEAD_DIM = 256
_LINEAR_DTYPES = ("BF16", "F16", "F32")
_NORM_DTYPES = ("BF16", "F32")
# Fields of drafters with features the engine does not run yet: the reason for each.
_UNSUPPORTED = {
    "draft_window_size": "a sink + window context cache",
    "sliding_window": "sliding-window draft layers",
    "final_logit_softcapping": "logit soft-capping",
    "rope_scaling": "RoPE scaling",
}


@dataclass(frozen=True)
class Drafter:
    path: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    tensors: dict[str, TensorInfo]  # canonical names (no "model." prefix)

    def dims(self) -> dict:
        """The plain view the engine takes (with ``tensors``' entries)."""
        return {"hidden_size": self.hidden, "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.intermediate, "rms_norm_eps": self.eps, "rope_theta": self.rope_theta,
                "block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id}

    def describe(self) -> dict:
        return {"dims": self.dims(), "tensors": {n: t.entry() for n, t in sorted(self.tensors.items())}}


def _read_config(folder: str) -> tuple[str, dict]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"[draft] {folder}: no config.json (a DFlash drafter folder holds config.json and "
                              f"its safetensors)")
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"[draft] {path}: unreadable ({e!s})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"[draft] {path}: not a JSON object")
    return path, raw


def _field(path: str, raw: dict, name: str, kind=int, low: int | None = None):
    value = raw.get(name)
    if value is None:
        raise CheckpointError(f"[draft] {path}: field {name} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise CheckpointError(f"[draft] {path}: field {name} must be {'a number' if kind is float else 'an integer'}, "
                              f"got {value!r}")
    if low is not None and value < low:
        raise CheckpointError(f"[draft] {path}: field {name} must be >= {low}, got {value}")
    return kind(value)


def _check_config(path: str, raw: dict, target: ModelConfig) -> dict:
    """The drafter's sizes from config.json, each checked against the target and the kernels."""
    archs = raw.get("architectures") or []
    dflash = raw.get("dflash_config")
    if "DFlash2DraftModel" in archs or raw.get("model_type") == "dflash2":
        raise CheckpointError(f"[draft] {path}: a DFlash2 drafter (architectures {archs!r}): not supported yet (its "
                              f"layers' dynamic convolution and candidate selector have no kernels here; "
                              f"docs/speculative.md)")
    if "DFlashDraftModel" not in archs or not isinstance(dflash, dict):
        raise CheckpointError(f"[draft] {path}: not a DFlash drafter (architectures {archs!r}, "
                              f'expected ["DFlashDraftModel"] with a dflash_config object)')
    for name, what in _UNSUPPORTED.items():
        if raw.get(name) is not None or dflash.get(name) is not None:
            raise CheckpointError(f"[draft] {path}: field {name}: {what} is not supported yet")
    if raw.get("attention_bias"):
        raise CheckpointError(f"[draft] {path}: field attention_bias: biased projections are not supported")
    if dflash.get("causal") or raw.get("dflash_query_causal"):
        raise CheckpointError(f"[draft] {path}: field dflash_config.causal: causal block attention is not supported")
    if any(t != "full_attention" for t in raw.get("layer_types") or []):
        raise CheckpointError(f"[draft] {path}: field layer_types: only full_attention draft layers are supported, "
                              f"got {raw['layer_types']!r}")
    c = {name: _field(path, raw, name, low=1) for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")}
    c["head_dim"] = _field(path, raw, "head_dim", low=1) if "head_dim" in raw else \
        c["hidden_size"] // c["num_attention_heads"]
    c["rms_norm_eps"] = _field(path, raw, "rms_norm_eps", float) if "rms_norm_eps" in raw else 1e-6
    c["rope_theta"] = _field(path, raw, "rope_theta", float) if "rope_theta" in raw else 1e6
    c["block_size"] = _field(path, raw, "block_size", low=2)
    for name in ("mask_token_id", "target_layer_ids"):
        if name not in dflash:
            raise CheckpointError(f"[draft] {path}: field dflash_config.{name} is missing")
    c["mask_token_id"] = _field(path, dflash, "mask_token_id", low=0)
    ids = dflash["target_layer_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"[draft] {path}: field dflash_config.target_layer_ids must be a non-empty list of "
                              f"layer indices, got {ids!r}")
    c["target_layer_ids"] = tuple(ids)

    def mismatch(name, got, want, why):
        raise CheckpointError(f"[draft] {path}: field {name} is {got}, but the target {target.source} has {want} "
                              f"({why}): this drafter is for another model")

    if c["hidden_size"] != target.hidden_size:
        mismatch("hidden_size", c["hidden_size"], target.hidden_size, "hidden size")
    if "vocab_size" in raw and raw["vocab_size"] != target.vocab_size:
        mismatch("vocab_size", raw["vocab_size"], target.vocab_size, "vocabulary")
    n_target = dflash.get("num_target_layers", raw.get("num_target_layers"))
    if n_target is not None and n_target != target.num_hidden_layers:
        mismatch("num_target_layers", n_target, target.num_hidden_layers, "layers")
    for i in ids:
        if not 0 <= i < target.num_hidden_layers:
            raise CheckpointError(f"[draft] {path}: field dflash_config.target_layer_ids holds layer {i}, outside the "
                                  f"target's layers 0..{target.num_hidden_layers - 1} ({target.source})")
    if len(set(ids)) != len(ids):
        raise CheckpointError(f"[draft] {path}: field dflash_config.target_layer_ids repeats a layer: {ids}")
    if c["mask_token_id"] >= target.vocab_size:
        raise CheckpointError(f"[draft] {path}: field dflash_config.mask_token_id {c['mask_token_id']} is outside "
                              f"the target's vocabulary of {target.vocab_size}")
    hd = c["head_dim"]
    if hd % 64 or hd > MAX_HEAD_DIM:
        raise CheckpointError(f"[draft] {path}: field head_dim is {hd}: the drafter's attention kernels take head "
                              f"dims that are multiples of 64 up to {MAX_HEAD_DIM}")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise CheckpointError(f"[draft] {path}: field num_attention_heads {c['num_attention_heads']} is not a "
                              f"multiple of num_key_value_heads {c['num_key_value_heads']}")
    for name in ("hidden_size", "intermediate_size"):
        if c[name] % 32:
            raise CheckpointError(f"[draft] {path}: field {name} is {c[name]}: the projection kernels take "
                                  f"multiples of 32")
    return c


def _expected(c: dict) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    H, hd, I = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    want = {"fc.weight": ((H, len(c["target_layer_ids"]) * H), _LINEAR_DTYPES),
            "hidden_norm.weight": ((H,), _NORM_DTYPES), "norm.weight": ((H,), _NORM_DTYPES)}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        want.update({
            p + "input_layernorm.weight": ((H,), _NORM_DTYPES),
            p + "post_attention_layernorm.weight": ((H,), _NORM_DTYPES),
            p + "self_attn.q_proj.weight": ((nq * hd, H), _LINEAR_DTYPES),
            p + "self_attn.k_proj.weight": ((nkv * hd, H), _LINEAR_DTYPES),
            p + "self_attn.v_proj.weight": ((nkv * hd, H), _LINEAR_DTYPES),
            p + "self_attn.o_proj.weight": ((H, nq * hd), _LINEAR_DTYPES),
            p + "self_attn.q_norm.weight": ((hd,), _NORM_DTYPES),
            p + "self_attn.k_norm.weight": ((hd,), _NORM_DTYPES),
            p + "mlp.gate_proj.weight": ((I, H), _LINEAR_DTYPES),
            p + "mlp.up_proj.weight": ((I, H), _LINEAR_DTYPES),
            p + "mlp.down_proj.weight": ((H, I), _LINEAR_DTYPES),
        })
    return want


def load_drafter(path: str | os.PathLike, target: ModelConfig) -> Drafter:
    """Reads the drafter folder at ``path`` (headers only) and checks it fits ``target``;
    CheckpointError naming the file and field or tensor otherwise."""
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise CheckpointError(f"[draft] {folder}: not a folder (draft= takes a DFlash drafter folder)")
    cfg_path, raw = _read_config(folder)
    c = _check_config(cfg_path, raw, target)
    found: dict[str, TensorInfo] = {}
    for file in shard_files(folder):
        tensors, _ = read_safetensors_header(file)
        for name, t in tensors.items():
            found[name[len("model."):] if name.startswith("model.") else name] = t
    want = _expected(c)
    for name, t in sorted(found.items()):
        if name not in want:
            why = " (quantized drafters are not supported yet)" if name.endswith((".scales", ".biases")) else ""
            raise CheckpointError(f"[draft] {t.file}: tensor {name}: not a tensor of a DFlash drafter{why}")
    tensors = {}
    for name, (shape, dtypes) in want.items():
        t = found.get(name)
        if t is None:
            raise CheckpointError(f"[draft] {folder}: tensor {name}: missing (expected {'/'.join(dtypes)} "
                                  f"{list(shape)})")
        if t.dtype not in dtypes:
            raise CheckpointError(f"[draft] {t.file}: tensor {name}: dtype {t.dtype}, expected "
                                  f"{' or '.join(dtypes)}")
        if t.shape != shape:
            raise CheckpointError(f"[draft] {t.file}: tensor {name}: shape {list(t.shape)}, expected {list(shape)}")
        tensors[name] = TensorInfo(name, t.file, t.offset, t.nbytes, t.dtype, t.shape)
    return Drafter(path=folder, hidden=c["hidden_size"], layers=c["num_hidden_layers"],
                   heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                   intermediate=c["intermediate_size"], eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
                   block_size=c["block_size"], target_layer_ids=c["target_layer_ids"],
                   mask_token_id=c["mask_token_id"], tensors=tensors)
