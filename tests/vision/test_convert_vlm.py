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
from .test_prompts import ONE, TWO, case, patches_of, reference_logits, reference_of


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


@pytest.fixture(scope="module")
def folder(vlm, tmp_path_factory):
    """The original with an MTP head, converted by metalqwen (language model at 4 bits, head kept)."""
    hf, _ = vlm(quantize=True, mtp=True, original=True)
    return convert(hf, tmp_path_factory.mktemp("convert-vlm") / "q4")


@pytest.fixture(scope="module")
def model(folder, device):
    return metalqwen.load(folder, device=device, max_context=128, kv_bits=16, progress=False)


def test_image_prompt_logits_equal_mlx_vlm_on_the_converted_folder(folder, model):
    """The converted folder read by metalqwen and by mlx-vlm's loader: a prompt with two pictures and
    text between them gives mlx-vlm's logits."""
    assert model.vision is not None and model.checkpoint.mtp
    prompt, images = case(TWO)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    want = np.array(reference_logits(reference_of(folder), ids, rows, grids))
    assert_logits_close(model.score(prompt, images=images, chat=True), want, logit_tolerance(model.config, 16))


def test_mtp_drafts_after_an_image_prompt_give_plain_decoding(ckpt_root, device):
    """The MTP head reads the image rows' features and rotary positions at prefill and drafts after
    the prompt at cache row + rope_delta: with a head that predicts the quiet trunk (test_speculative's),
    converted with the tower by metalqwen, its drafts are accepted and the tokens are plain greedy's."""
    from ..engine.test_speculative import _mtp_predicts_the_trunk
    from .conftest import write_vlm_checkpoint

    hf, _ = write_vlm_checkpoint(ckpt_root, "vlm-mtp-spec", seed=11, tied=False, mtp=True, mixer_gain=1e-4,
                                 edit=_mtp_predicts_the_trunk)
    folder = convert(hf, os.path.join(ckpt_root, "vlm-mtp-spec-b8"), bits=8)
    model = metalqwen.load(folder, device=device, max_context=96, progress=False, speculative="mtp")
    prompt, images = case(ONE)
    plain = model.generate(prompt, max_tokens=8, images=images, chat=True, speculative="off")
    spec = model.generate(prompt, max_tokens=8, images=images, chat=True, speculative="mtp")
    assert len(plain.tokens) == 8 and spec.tokens == plain.tokens
    assert spec.stats.verify_steps > 0 and spec.stats.accepted > 0


def test_the_cli_converts_without_quantizing(vlm, tmp_path):
    from ..support.cli import run

    hf, reference = vlm(mtp=True, original=True)
    out = run("convert", hf, str(tmp_path / "cli"), "--no-quantize", "--mtp", "drop")
    assert out.returncode == 0, out.stderr
    theirs, mine = _arrays(reference), _arrays(tmp_path / "cli")
    assert sorted(mine) == sorted(theirs) and all(np.array_equal(mine[k][1], theirs[k][1]) for k in theirs)


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
