"""The vision tower on the GPU (shaders/vision.metal encoded by csrc/engine/vision.cpp) against
mlx-vlm 0.7.10's Qwen3-VL VisionModel on the tiny folder: the merged features of images of
several sizes and aspect ratios, including one pushed up to min_pixels and one down to
max_pixels. The reference runs the folder's bf16 weights in float32 (the tower's activations are
f32 here, as docs/images.md explains), so both sides compute with the same values and differ only
in summation order."""

import json
import os

import numpy as np
import pytest

from metalqwen.checkpoint import CheckpointError
from metalqwen.vision import VisionTower

from .conftest import picture

# Relative to the largest feature: f32 sums over at most 1536 terms in another order, through two
# blocks, LayerNorms and GELUs, give about 5e-7; mlx-vlm computing in bf16 is 6e-3 off, and
# a wrong position, rotary or merge order far more.
TOLERANCE = 5e-6


@pytest.fixture(scope="module")
def tower(vlm, device):
    return VisionTower.load(vlm(), device)


def reference_of(folder):
    """features(rows, h, w) from mlx-vlm's VisionModel with the folder's weights in float32: a
    quantized module (one with .scales) quantized as mlx-vlm's loader does, its scales and biases in
    float32 (so its dequantized weights are exactly the folder's, as on the GPU)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.qwen3_5.config import VisionConfig
    from mlx_vlm.models.qwen3_5.vision import VisionModel

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    model = VisionModel(VisionConfig.from_dict(config["vision_config"]))
    weights = {k[len("vision_tower."):]: v for k, v in mx.load(os.path.join(folder, "model.safetensors")).items()
               if k.startswith("vision_tower.")}
    if "quantization" in config:
        q = config["quantization"]
        nn.quantize(model, q["group_size"], q["bits"], class_predicate=lambda p, m: f"{p}.scales" in weights)
    model.load_weights([(k, v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v)
                        for k, v in weights.items()])

    def features(rows, h, w):
        out, deepstack = model(mx.array(rows), mx.array([[1, h, w]]))
        assert deepstack == []
        return np.array(out.astype(mx.float32))

    return features


@pytest.fixture(scope="module")
def reference(vlm):
    return reference_of(vlm())


def relative_error(got, want):
    return np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()


@pytest.mark.parametrize("h,w", [(64, 64), (96, 64), (20, 30), (300, 200)])
def test_features_equal_mlx_vlm(tower, reference, h, w):
    rows, (t, gh, gw) = tower.patches(picture(h, w, seed=h + w))
    got = tower.features_of_patches(rows, gh, gw)
    want = reference(rows, gh, gw)
    assert got.shape == want.shape == (gh * gw // 4, tower.config.out_hidden_size)
    err = relative_error(got, want)
    assert err <= TOLERANCE, f"{h} x {w} (grid {gh} x {gw}): max error {err:.2e} of the largest feature"


@pytest.mark.parametrize("variant", [dict(dtype="float16"), dict(dtype="float32"), dict(odd=True)])
def test_other_dtypes_and_sizes(vlm, device, variant):
    """f16 towers (linears f16, their vectors and the 5-D patch embedding widened to f32 copies,
    the position grid f16), f32 towers, and sizes off the 32-wide tiles and lanes."""
    folder = vlm(**variant)
    tower = VisionTower.load(folder, device)
    rows, (_, gh, gw) = tower.patches(picture(96, 64, seed=9))
    want = reference_of(folder)(rows, gh, gw)
    assert relative_error(tower.features_of_patches(rows, gh, gw), want) <= TOLERANCE


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
def test_quantized_towers(vlm, device, bits, group):
    """Towers mlx_vlm.convert quantized with the language model (a quant_predicate that does not skip
    them): at 4 bits, group 64 only the blocks' fc2 and the merger (their input widths 64 and 128);
    at 8 bits, group 32 every linear and the position grid. The linears run the projections' qmm."""
    from metalqwen.checkpoint import load_checkpoint

    folder = vlm(tower_quant=(bits, group))
    quantized = {n[:-len(".scales")] for n in load_checkpoint(folder).vision if n.endswith(".scales")}
    assert {n.split(".", 1)[1] for n in quantized} == (
        {"blocks.0.mlp.linear_fc2", "blocks.1.mlp.linear_fc2", "merger.linear_fc1", "merger.linear_fc2"}
        if group == 64 else {f"blocks.{i}.{m}" for i in (0, 1) for m in ("attn.qkv", "attn.proj", "mlp.linear_fc1",
                                                                         "mlp.linear_fc2")}
        | {"merger.linear_fc1", "merger.linear_fc2", "pos_embed"})
    tower = VisionTower.load(folder, device)
    reference = reference_of(folder)
    for h, w in ((64, 64), (300, 200)):
        rows, (_, gh, gw) = tower.patches(picture(h, w, seed=h + w))
        assert relative_error(tower.features_of_patches(rows, gh, gw), reference(rows, gh, gw)) <= TOLERANCE


def test_features_of_an_image(tower):
    img = picture(70, 90, seed=5)
    rows, (_, gh, gw) = tower.patches(img)
    assert np.array_equal(tower.features(img), tower.features_of_patches(rows, gh, gw))


def test_bad_patch_grids_are_refused(tower):
    rows, (_, gh, gw) = tower.patches(picture(64, 64))
    with pytest.raises(Exception, match=r"\[vision\] patch grid 3 x 4"):
        tower.features_of_patches(rows[:12], 3, 4)
    with pytest.raises(Exception, match=r"\[vision\] 15 patch values"):
        tower.features_of_patches(rows.reshape(-1)[:15].reshape(1, 15), 2, 2)


def test_a_text_only_folder_has_no_tower(demo, device):
    with pytest.raises(CheckpointError, match="has no vision tower"):
        VisionTower.load(demo, device)
