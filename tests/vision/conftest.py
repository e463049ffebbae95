"""Tiny random Qwen3.5 vision-language checkpoints, made the way users get theirs.

A Hugging Face original is written first (the language model by model_fixtures.write_hf_checkpoint;
the vision tower under ``model.visual.*`` with the Conv3d patch embedding in PyTorch's
[out, C, T, P, P] order, its parameters drawn by mlx-vlm's own ``VisionModel`` from a tiny
``vision_config``, norms perturbed so they are not the identity) with a Qwen3-VL
``preprocessor_config.json``; ``mlx_vlm.convert`` then writes the MLX folder exactly as users'
``mlx-community`` folders are made (``vision_tower.*`` beside ``language_model.*``,
``processor_config.json``). Building one takes well under a second.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest

from ..support import model_fixtures as mf
from ..support.require import require

# The tower's shape: 2 blocks of hidden 32 (2 heads of 16), MLP 64, a 4 x 4 learned position grid,
# patches of 2 x 16 x 16, 2 x 2 merged into the language model's hidden size (512, DEMO_DIMS).
VISION_CONFIG = dict(model_type="qwen3_5", depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=512,
                     num_heads=2, patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                     num_position_embeddings=16, deepstack_visual_indexes=[])
# min/max pixels 64 x 64 and 128 x 128: small images reach both limits.
MIN_PIXELS, MAX_PIXELS = 64 * 64, 128 * 128
PREPROCESSOR = {"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
                "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}}
# The vision tokens, added to the tiny tokenizer (918 tokens) as Qwen's are, with their ids (in the
# embedding table's 1024 rows).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TOKEN_IDS = dict(vision_start_token_id=918, vision_end_token_id=919, image_token_id=920, video_token_id=921)


def add_vision_tokens(folder: str) -> None:
    """Adds VISION_TOKENS to the folder's tokenizer as special tokens, checking they get TOKEN_IDS."""
    from tokenizers import AddedToken, Tokenizer

    path = os.path.join(folder, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    ids = [tok.token_to_id(t) for t in VISION_TOKENS]
    assert ids == [TOKEN_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id",
                                          "video_token_id")], ids
    tok.save(path)
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    mf.edit_json(os.path.join(folder, "tokenizer_config.json"), lambda c: c["added_tokens_decoder"].update(
        {str(i): dict(content=t, **entry) for t, i in zip(VISION_TOKENS, ids)}))


def vision_tensors(seed: int, config: dict) -> dict[str, np.ndarray]:
    """The tower's float32 parameters as a Hugging Face original names and lays them out."""
    mx = require("mlx.core")
    from mlx.utils import tree_flatten
    from mlx_vlm.models.qwen3_5.config import VisionConfig
    from mlx_vlm.models.qwen3_5.vision import VisionModel

    mx.random.seed(seed)
    params = dict(tree_flatten(VisionModel(VisionConfig(**config)).parameters()))
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in params.items():
        a = np.array(value.astype(mx.float32))
        if ".norm" in name and name.endswith(".weight"):
            a = (1 + 0.2 * rng.standard_normal(a.shape)).astype(np.float32)
        elif ".norm" in name and name.endswith(".bias"):
            a = (0.1 * rng.standard_normal(a.shape)).astype(np.float32)
        elif name.endswith(".bias"):  # mlx initialises them uniformly; make them matter
            a = (0.2 * rng.standard_normal(a.shape)).astype(np.float32)
        if name == "patch_embed.proj.weight":
            a = a.transpose(0, 4, 1, 2, 3)  # mlx [out, T, P, P, C] -> PyTorch [out, C, T, P, P]
        out["model.visual." + name] = a
    return out


def quantize_everything(path, module):
    """A quant_predicate for mlx_vlm.convert that does not skip the tower (as converters before
    mlx-vlm's skip_multimodal_module did): every module whose input width the group divides."""
    return True


def write_vlm_checkpoint(root, name: str = "vlm", *, seed: int = 0, quantize: bool = False, dtype: str = "bfloat16",
                         vision: dict | None = None, tower_quant: tuple[int, int] | None = None,
                         **hf_options) -> tuple[str, str]:
    """(hf_path, mlx_path) of a tiny Qwen3.5 VLM: the original, and mlx_vlm.convert's folder of it
    (``dtype``: what the converter casts float parameters to; with ``quantize`` the language model at
    4 bits, mlx-vlm's default, the tower left float; with ``tower_quant`` = (bits, group) the tower's
    linears and position grid too, where the group divides their input width, and the language
    model). ``vision`` overrides VISION_CONFIG's fields; ``hf_options`` go to write_hf_checkpoint
    (``mtp``: the original has an MTP head, which mlx_vlm.convert drops; ``moe``: a qwen3_5_moe model)."""
    require("mlx_vlm")
    from mlx_vlm.convert import convert

    config = {**VISION_CONFIG, **(vision or {})}
    hf = mf.write_hf_checkpoint(os.path.join(root, name + "-hf"), seed=seed, **hf_options)
    add_vision_tokens(hf)
    tensors = vision_tensors(seed, config)
    mf.add_tensors(os.path.join(hf, "model.safetensors"),
                   {n: ("BF16", a.shape, mf.bf16_bits(a).tobytes()) for n, a in tensors.items()})
    mf.edit_json(os.path.join(hf, "config.json"), lambda c: c.update(vision_config=config, **TOKEN_IDS))
    with open(os.path.join(hf, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
    mlx = os.path.join(root, name)
    with contextlib.redirect_stdout(io.StringIO()):
        if tower_quant:
            convert(hf, mlx, dtype=dtype, quantize=True, q_bits=tower_quant[0], q_group_size=tower_quant[1],
                    quant_predicate=quantize_everything)
        else:
            convert(hf, mlx, dtype=dtype, quantize=quantize)
    return hf, mlx


def picture(h, w, seed=0):
    """A smooth picture with noise (bicubic overshoot and rounding both matter)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([127 + 100 * np.sin(x / 7.0), 127 + 100 * np.cos(y / 5.0), (x * 3 + y * 5) % 256], -1)
    return np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


_built: dict = {}


# A tower whose sizes are not multiples of 32 (head dim 24, MLP width 72, merged width 192) in one block.
ODD_VISION = dict(depth=1, hidden_size=48, intermediate_size=72, num_heads=2)
# The MoE language model of model_fixtures' "moe" variant (8 experts, top-2).
MOE = mf.VARIANTS["moe"].moe


@pytest.fixture(scope="session")
def vlm(ckpt_root):
    """vlm(quantize=False, dtype="bfloat16", odd=False, tower_quant=None, moe=False, mtp=False,
    original=False) -> the mlx-vlm folder of the tiny VLM (``odd``: the ODD_VISION tower;
    ``tower_quant``: (bits, group) of a quantized tower; ``moe``: the MOE language model; ``mtp``:
    the original has an MTP head; ``original``: (the Hugging Face original, the mlx-vlm folder)),
    each variant built once per session."""

    def get(quantize: bool = False, dtype: str = "bfloat16", odd: bool = False,
            tower_quant: tuple[int, int] | None = None, moe: bool = False, mtp: bool = False,
            original: bool = False):
        key = (quantize, dtype, odd, tower_quant, moe, mtp)
        if key not in _built:
            name = ("vlm" + "-q4" * quantize + ("" if dtype == "bfloat16" else "-" + dtype) + "-odd" * odd
                    + ("-tower-b{}-g{}".format(*tower_quant) if tower_quant else "") + "-moe" * moe + "-mtp" * mtp)
            _built[key] = write_vlm_checkpoint(ckpt_root, name, quantize=quantize, dtype=dtype,
                                               vision=ODD_VISION if odd else None, tower_quant=tower_quant,
                                               moe=MOE if moe else None, mtp=mtp)
        return _built[key] if original else _built[key][1]

    return get
