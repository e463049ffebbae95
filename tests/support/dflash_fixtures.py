"""Tiny DFlash drafters (issue 28) built with the reference's own classes, mlx-vlm's
``DFlashDraftModel`` (mlx_vlm/speculative/drafters/qwen3_dflash), and written as a published
drafter folder is: ``config.json`` (``architectures: ["DFlashDraftModel"]``, ``model_type: qwen3``,
``block_size``, ``num_target_layers``, ``dflash_config.{target_layer_ids, mask_token_id}``) and
``model.safetensors`` in bf16 with names without a ``model.`` prefix (``fc.weight [H, n·H]``,
``hidden_norm``, ``layers.N.*``, ``norm``). No embedding or lm_head: the target's are used."""

from __future__ import annotations

import json
import os

import numpy as np

from .require import require


def drafter_config(target_cfg, *, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 128,
                   intermediate: int = 1024, target_layer_ids=(0, 2), mask_token_id: int | None = None,
                   block_size: int = 16) -> dict:
    """config.json of a drafter for the target whose ModelConfig is ``target_cfg``."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": target_cfg.vocab_size,
        "max_position_embeddings": 262144,
        "rope_theta": 1e6,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {"target_layer_ids": list(target_layer_ids),
                          "mask_token_id": target_cfg.vocab_size - 1 if mask_token_id is None else mask_token_id},
    }


def reference_drafter(config: dict, seed: int = 0):
    """mlx-vlm's DFlashDraftModel for ``config`` with random bf16-representable weights: linears
    at their default scale, norms 1 + 0.1·N(0, 1) (so each norm weight matters)."""
    require("mlx_vlm")
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel, ModelConfig

    mx.random.seed(seed)
    model = DFlashDraftModel(ModelConfig.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            value = mx.array(1 + 0.1 * rng.standard_normal(p.shape, dtype=np.float32))
        else:
            value = p
        weights[name] = value.astype(mx.bfloat16)
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


def write_drafter(folder, config: dict, seed: int = 0) -> str:
    """Writes a drafter folder (config.json, model.safetensors) from the reference's model."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    model = reference_drafter(config, seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    mx.save_safetensors(os.path.join(os.fspath(folder), "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    return os.fspath(folder)


def load_reference(folder, target_path):
    """The drafter folder loaded by mlx-vlm's own loader, in float32, bound to the target's
    embedding and lm_head as mlx-lm loads them (float32, dequantized: model_fixtures' reference)."""
    require("mlx_vlm")
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_vlm.speculative.drafters import load_drafter

    from .model_fixtures import _reference_model

    drafter, kind = load_drafter(os.fspath(folder))
    assert kind == "dflash", kind
    drafter.update(tree_map(lambda p: p.astype(mx.float32), drafter.parameters()))
    drafter.bind(_reference_model(os.fspath(target_path), False))
    return drafter
