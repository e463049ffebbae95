"""The vision tower's tensors as mlx-vlm writes them are validated and described beside the
language model; text-only folders load exactly as before; a malformed tower is a CheckpointError
naming the file and tensor (or config field)."""

import os

import pytest

from metalqwen.checkpoint import CheckpointError, ConfigError, load_checkpoint

from ..support import model_fixtures as mf
from .conftest import VISION_CONFIG


@pytest.fixture
def damaged(vlm, tmp_path):
    """A private copy of the tiny VLM folder to break (the index file removed: edits go to the shard)."""
    folder = mf.copy_checkpoint(vlm(), tmp_path / "vlm")
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    return folder


def shard(folder):
    return os.path.join(folder, "model.safetensors")


def test_the_tower_is_validated_and_described(vlm):
    ck = load_checkpoint(vlm())
    c = ck.vision_config
    assert (c.depth, c.hidden_size, c.num_heads, c.head_dim, c.out_hidden_size) == (2, 32, 2, 16, 512)
    assert (c.patch_dim, c.grid_side, c.merged_dim) == (1536, 4, 128)
    assert len(ck.vision) == 33 and all(n.startswith("vision_tower.") for n in ck.vision)
    assert not ck.ignored and not ck.unknown
    assert not any(n.startswith("vision_tower.") for n in ck.tensors)  # the language model's are apart
    d = ck.describe()["vision"]
    assert d["dims"]["num_position_embeddings"] == 16 and d["tensors"].keys() == ck.vision.keys()
    assert d["tensors"]["vision_tower.patch_embed.proj.weight"][3:5] == ("BF16", (32, 2, 16, 16, 3))


def test_a_4bit_language_model_keeps_a_float_tower(vlm):
    ck = load_checkpoint(vlm(quantize=True))  # mlx_vlm.convert --quantize leaves the tower alone
    assert ck.quant("language_model.model.layers.0.mlp.down_proj") is not None
    assert len(ck.vision) == 33 and {t.dtype for t in ck.vision.values()} == {"BF16"}


def test_a_quantized_tower_is_described_with_its_formats(vlm):
    """mlx_vlm.convert with a quant_predicate that does not skip the tower, 4 bits, group 64: the
    linears whose input width 64 divides are quantized (their bias stays BF16), the others float."""
    ck = load_checkpoint(vlm(tower_quant=(4, 64)))
    fc2, qkv = ck.vision["vision_tower.merger.linear_fc2.weight"], ck.vision["vision_tower.blocks.0.attn.qkv.weight"]
    assert (fc2.dtype, fc2.bits, fc2.group_size, fc2.mode) == ("U32", 4, 64, "affine") and fc2.shape == (512, 16)
    assert ck.vision["vision_tower.merger.linear_fc2.bias"].dtype == "BF16"
    assert (qkv.dtype, qkv.bits) == ("BF16", None)
    assert ck.describe()["vision"]["tensors"]["vision_tower.merger.linear_fc2.scales"][5:7] == (4, 64)


def test_a_folder_without_the_tower_loads_as_text_only(damaged):
    full = load_checkpoint(damaged)
    mf.rewrite_header(shard(damaged), lambda h: [h.pop(n) for n in list(h) if n.startswith("vision_tower.")])
    ck = load_checkpoint(damaged)  # vision_config stays in config.json, as mlx-lm conversions keep it
    assert ck.vision_config is None and ck.vision == {} and ck.describe()["vision"] is None
    assert ck.tensors.keys() == full.tensors.keys()
    assert ck.describe()["dims"] == full.describe()["dims"]


def drop(name):
    return lambda h: h.pop(name)


def reshape(name, shape):
    return lambda h: h[name].update(shape=shape)


@pytest.mark.parametrize("edit,message", [
    (drop("vision_tower.blocks.1.mlp.linear_fc2.bias"), "tensor vision_tower.blocks.1.mlp.linear_fc2.bias: missing"),
    (reshape("vision_tower.blocks.0.attn.qkv.bias", [48, 2]),
     r"vision_tower.blocks.0.attn.qkv.bias: shape \[48, 2\], expected \[96\]"),
    (reshape("vision_tower.patch_embed.proj.weight", [32, 3, 2, 16, 16]), "PyTorch's Conv3d order"),
    ({"vision_tower.blocks.2.norm1.weight": ("BF16", [32], bytes(64))},
     "vision_tower.blocks.2.norm1.weight: not a tensor of a 2-block"),
    ({"vision_tower.blocks.0.attn.qkv.scales": ("BF16", [96, 1], bytes(192))},
     r"qkv.weight: BF16 \[96, 32\] with scales \[96, 1\] is not an MLX quantized weight"),
    ({"vision_tower.patch_embed.proj.scales": ("BF16", [32, 1], bytes(64))},
     "patch_embed.proj.scales: not a tensor of a 2-block"),
    (lambda h: h["vision_tower.merger.norm.bias"].update(dtype="F16"),
     "merger.norm.bias: dtype F16, but vision_tower.merger.norm.weight is BF16"),
])
def test_a_malformed_tower_is_refused(damaged, edit, message):
    if isinstance(edit, dict):  # tensors to add
        mf.add_tensors(shard(damaged), edit)
    else:
        mf.rewrite_header(shard(damaged), edit)
    with pytest.raises(CheckpointError, match=message) as e:
        load_checkpoint(damaged)
    assert damaged in str(e.value)


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("vision_config"), "vision_tower.* tensors .* has no vision_config"),
    (lambda c: c["vision_config"].update(deepstack_visual_indexes=[0]), "no DeepStack"),
    (lambda c: c["vision_config"].update(out_hidden_size=256), "out_hidden_size 256 differs"),
    (lambda c: c["vision_config"].update(num_heads=3), "not a multiple of num_heads 3"),
    (lambda c: c["vision_config"].update(hidden_act="silu"), "hidden_act 'silu'"),
    (lambda c: c["vision_config"].pop("depth"), "vision_config.depth is missing"),
])
def test_a_bad_vision_config_is_refused(damaged, edit, message):
    mf.edit_json(os.path.join(damaged, "config.json"), edit)
    with pytest.raises(ConfigError, match=message):
        load_checkpoint(damaged)


def test_the_fixture_config_is_what_the_folder_says(vlm):
    import json

    with open(os.path.join(vlm(), "config.json")) as f:
        assert json.load(f)["vision_config"] == VISION_CONFIG
    assert os.path.isfile(os.path.join(vlm(), "processor_config.json"))
