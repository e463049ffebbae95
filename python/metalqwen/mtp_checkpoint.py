"""The multi-token-prediction (MTP) head of an MLX folder: where its tensors are, their
validation, and the convention its RMSNorms are stored in.

Where: ``mtp.*``, ``language_model.mtp.*`` or ``language_model.model.mtp.*`` tensors in the
shards, or a sidecar ``mtp.safetensors`` the index does not list (``metalqwen add-mtp`` writes
one; folders in the wild have them too). The engine gets them renamed ``mtp.*``.

What (``mtp_num_hidden_layers: 1``, dims as the trunk's attention layers): ``mtp.fc``
[H, 2H], ``mtp.pre_fc_norm_embedding`` / ``mtp.pre_fc_norm_hidden`` / ``mtp.norm`` [H], and
``mtp.layers.0.*`` a full-attention decoder layer with the trunk's MLP kind (dense, or the
sparse MoE block named as mlx-lm names the trunk's: ``mlp.switch_mlp.*``, ``mlp.gate``, ...).

Norm conventions: all MTP RMSNorms are zero-centred (used as 1 + w). Converters differ:
``metalqwen convert``/``add-mtp`` store 1 + w (as mlx-lm stores the trunk's); mlx-lm's
sanitize shifts only raw Hugging Face weights, keyed on the conv1d layout (PRs #990, #1320,
#1442), mlx-vlm's MTP drafter shifts only raw ``mtp.``-prefixed weights (PR #1554), and some
published bundles mix conventions within the head (the layer's norms raw, ``mtp.norm``
shifted: omlx PR #1507). So the convention is detected per group by the median, as for the
trunk (checkpoint_layout.norm_convention): the layer's four norms together, and ``mtp.norm``
alone. ``pre_fc_norm_*`` cannot be told apart by magnitude (their learned gains sit below
0.5 in either convention, e.g. 0.49 and 0.27 shifted on Qwen3.6-35B-A3B: omlx PR #3750),
so they follow the layer's norms. Unshifted groups get ``add = 1`` (the engine adds it at
load); a group that looks shifted twice is refused.
"""

from __future__ import annotations

import dataclasses
import os

from .checkpoint_checks import Validator, norm_median, take_layer
from .checkpoint_layout import CONVENTION_HOW, MTP_PREFIXES, SHIFTED_NORMS, Linear, Vector, norm_convention
from .config import CheckpointError, ModelConfig
from .shards import TensorInfo, read_safetensors_header

__all__ = ["SIDECAR", "mtp_head", "sidecar_tensors", "how_to_get_mtp"]

SIDECAR = "mtp.safetensors"
_LONGEST_FIRST = tuple(sorted(MTP_PREFIXES, key=len, reverse=True))


def how_to_get_mtp(folder: str) -> str:
    return (f"{folder} has no MTP head (no mtp.* tensors): make an MTP-capable folder from the Hugging Face original "
            f"with `metalqwen convert HF_DIR OUT_DIR`, or add the head to this one with "
            f"`metalqwen add-mtp HF_DIR {folder}`")


def sidecar_tensors(folder: str, shard_paths: list[str]) -> dict[str, TensorInfo]:
    """The tensors of ``folder/mtp.safetensors`` when the shards read do not include it (the
    index does not list it); each must be an MTP tensor."""
    path = os.path.join(folder, SIDECAR)
    if not os.path.isfile(path) or any(os.path.samefile(path, p) for p in shard_paths):
        return {}
    found, _ = read_safetensors_header(path)
    for name in found:
        if not name.startswith(MTP_PREFIXES):
            raise CheckpointError(f"[checkpoint] {path}: tensor {name}: not an MTP tensor (the sidecar {SIDECAR} "
                                  f"holds only {', '.join(p + '*' for p in MTP_PREFIXES)})")
    return found


def _canonical(name: str) -> str:
    prefix = next(p for p in _LONGEST_FIRST if name.startswith(p))
    return "mtp." + name[len(prefix):]


def _layer_count(config: ModelConfig) -> int | None:
    raw = config.raw
    text = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    return text.get("mtp_num_hidden_layers", raw.get("mtp_num_hidden_layers"))


def mtp_head(folder: str, config: ModelConfig, found: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The validated MTP head (``mtp.*`` name -> TensorInfo, norms with their load-time ``add``),
    or {} when ``found`` is empty. CheckpointError naming the file and tensor otherwise."""
    if not found:
        return {}
    tensors: dict[str, TensorInfo] = {}
    for name, t in found.items():
        c = _canonical(name)
        if c in tensors:
            raise CheckpointError(f"[checkpoint] {folder}: the MTP tensor {c} is there twice: {tensors[c].name} in "
                                  f"{tensors[c].file} and {name} in {t.file}")
        tensors[c] = t
    layers = _layer_count(config)
    if layers not in (None, 1):
        raise CheckpointError(f"[checkpoint] {config.source}: mtp_num_hidden_layers = {layers}: metalqwen runs an "
                              f"MTP head of exactly one layer (Qwen3.5's)")
    H = config.hidden_size
    v = Validator(config, tensors)
    v.linear(Linear("mtp.fc", H, 2 * H), "mtp.fc")
    for norm in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        v.vector(Vector(norm, (H,)), norm)
    take_layer(v, config, "mtp.layers.0.", True)
    extra = sorted(set(tensors) - set(v.used))
    if extra:
        v.fail(extra[0], "not part of a one-layer MTP head (expected mtp.fc, mtp.pre_fc_norm_*, mtp.norm and "
                         "mtp.layers.0.*)")
    add = _unshifted_norms(folder, v.used)
    return {n: dataclasses.replace(t, add=add.get(n, 0.0)) for n, t in sorted(v.used.items())}


def _unshifted_norms(folder: str, used: dict[str, TensorInfo]) -> dict[str, float]:
    """{norm name: 1.0} for the MTP norms stored as w (see the module docstring)."""
    layer = sorted(n for n in used if n.startswith("mtp.layers.0.") and n.endswith(SHIFTED_NORMS))
    groups = [(layer, layer + ["mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"]),
              (["mtp.norm.weight"], ["mtp.norm.weight"])]
    add: dict[str, float] = {}
    for judged, applies_to in groups:
        median = norm_median([used[n] for n in judged])
        how = norm_convention(median)
        if how == "twice":
            t = used[judged[0]]
            raise CheckpointError(f"[checkpoint] {t.file}: tensor {t.name}: the MTP head's RMSNorm weights "
                                  f"({', '.join(judged)}) have median {median:.2f}, expected about 1 (stored 1 + w) "
                                  f"or 0 (stored w): they look {CONVENTION_HOW[how]}")
        if how == "unshifted":
            add.update({n: 1.0 for n in applies_to})
    return add
