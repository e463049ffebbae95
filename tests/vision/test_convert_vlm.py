"""`metalqwen convert` of a Hugging Face Qwen3.5 VLM original (language model under
model.language_model.*, tower under model.visual.* in PyTorch's Conv3d order, as Qwen publishes
it): every tensor mlx_vlm.convert writes, array for array (bf16, and the language model quantized
at 4 bits), plus the MTP head mlx-vlm drops; the folder's image-prompt logits equal mlx-vlm's
model of it; the text-only conversion as before with vision="drop"."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import metalqwen
from metalqwen.convert import convert

from ..checkpoint.test_convert import _arrays
from ..support.model_checks import assert_logits_close, logit_tolerance
from .test_prompts import case, patches_of, reference_logits, reference_of, TWO


@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "q4"])
def test_the_folder_equals_mlx_vlm_convert_array_for_array(vlm, tmp_path, quantize):
    hf, reference = vlm(quantize=quantize, mtp=True, original=True)
    ours = convert(hf, tmp_path / "ours", quantize=quantize)
    theirs, mine = _arrays(reference), _arrays(ours)
    assert sorted(k for k in mine if not k.startswith("mtp.")) == sorted(theirs)
    assert any(k.startswith("mtp.") for k in mine) and any(k.startswith("vision_tower.") for k in mine)
    for name, (tag, a) in theirs.items():
        assert mine[name][0] == tag and mine[name][1].shape == a.shape, name
        assert np.array_equal(mine[name][1], a), f"{name} differs from mlx_vlm.convert's"
    with open(os.path.join(reference, "config.json")) as f, open(os.path.join(ours, "config.json")) as g:
        want, got = json.load(f), json.load(g)
    assert got["vision_config"] == {k: v for k, v in want["vision_config"].items() if k in got["vision_config"]}
    assert ("quantization" in got) == quantize and got.get("quantization") == want.get("quantization")
    assert os.path.isfile(os.path.join(ours, "preprocessor_config.json"))
    dropped = _arrays(convert(hf, tmp_path / "text", quantize=quantize, vision="drop"))
    assert sorted(dropped) == sorted(k for k in mine if not k.startswith("vision_tower."))
    with open(tmp_path / "text" / "config.json") as f:
        assert "vision_config" not in json.load(f)


def test_image_prompt_logits_equal_mlx_vlm_on_the_converted_folder(vlm, tmp_path, device):
    """The converted folder (language model at 4 bits, MTP head kept) read by metalqwen and by
    mlx-vlm's loader: a prompt with two pictures and text between them gives mlx-vlm's logits."""
    hf, _ = vlm(quantize=True, mtp=True, original=True)
    folder = convert(hf, tmp_path / "ours")
    model = metalqwen.load(folder, device=device, max_context=128, kv_bits=16, progress=False)
    assert model.vision is not None and model.checkpoint.mtp
    prompt, images = case(TWO)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    want = np.array(reference_logits(reference_of(folder), ids, rows, grids))
    assert_logits_close(model.score(prompt, images=images, chat=True), want, logit_tolerance(model.config, 16))


def test_an_original_with_a_tower_but_no_vision_config_is_refused(vlm, tmp_path):
    import shutil

    from ..support import model_fixtures as mf

    hf, _ = vlm(original=True)
    broken = shutil.copytree(hf, tmp_path / "broken")
    mf.edit_json(os.path.join(broken, "config.json"), lambda c: c.pop("vision_config"))
    with pytest.raises(metalqwen.CheckpointError, match="model.visual.* tensors but no vision_config"):
        convert(broken, tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")
    convert(broken, tmp_path / "text", vision="drop")
