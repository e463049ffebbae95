"""`metalqwen convert` / `add-mtp`: the trunk array-for-array equal to mlx_lm.convert's, the
MTP head kept in the trunk's conventions, add-mtp reading only the shards that hold it."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import metalqwen
from metalqwen.checkpoint import read_safetensors_header, tensor_view
from metalqwen.convert import add_mtp, convert
from metalqwen.demo_checkpoint import bf16_bits, bf16_to_f32, dequantize_affine

from ..support import model_fixtures as mf
from ..support.require import require


def _arrays(folder) -> dict[str, tuple[str, np.ndarray]]:
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        found, _ = read_safetensors_header(path)
        out.update({name: (t.dtype, np.array(tensor_view(t))) for name, t in found.items()})
    return out


@pytest.mark.parametrize("variant", ["wide_untied_g32", "flat_b8"])
def test_the_trunk_equals_mlx_lm_convert_array_for_array(converted, variant, tmp_path):
    hf, reference = converted(variant)
    v = mf.VARIANTS[variant]
    ours = convert(hf, tmp_path / "ours", bits=v.bits, group_size=v.group_size)
    theirs, mine = _arrays(reference), _arrays(ours)
    trunk = {k: v for k, v in mine.items() if not k.startswith("mtp.")}
    assert sorted(trunk) == sorted(theirs)
    for name, (tag, a) in theirs.items():
        assert trunk[name][0] == tag and trunk[name][1].shape == a.shape, name
        assert np.array_equal(trunk[name][1], a), f"{name} differs from mlx_lm.convert's"
    with open(os.path.join(reference, "config.json")) as f, open(os.path.join(ours, "config.json")) as g:
        want, got = json.load(f), json.load(g)
    assert got["quantization"] == want["quantization"] and got["quantization_config"] == want["quantization_config"]
    assert (any(k.startswith("mtp.") for k in mine)) == v.mtp


def test_the_converted_folder_loads_in_mlx_lm_and_metalqwen(converted, tmp_path, device):
    mlx_lm = require("mlx_lm")
    hf, reference = converted("wide_untied_g32")
    ours = convert(hf, tmp_path / "ours", bits=4, group_size=32)
    mlx_lm.load(ours)
    ids = [5, 9, 200, 17]
    got = metalqwen.load(ours, device=device, max_context=16, progress=False).score(ids)
    want = metalqwen.load(reference, device=device, max_context=16, progress=False).score(ids)
    assert np.array_equal(got, want)


def test_mtp_tensors_are_quantized_and_their_norms_stored_as_one_plus_w(converted, tmp_path):
    hf, _ = converted("wide_untied_g32")
    source = _arrays(hf)
    ours = _arrays(convert(hf, tmp_path / "ours", bits=4, group_size=32))
    mtp = sorted(k for k in ours if k.startswith("mtp."))
    assert "mtp.fc.scales" in mtp and "mtp.layers.0.self_attn.q_proj.biases" in mtp
    for norm in ("mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                 "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.self_attn.q_norm.weight"):
        w = bf16_to_f32(source[norm][1])
        assert ours[norm][0] == "BF16" and np.array_equal(ours[norm][1], bf16_bits(w + 1)), norm
    w = bf16_to_f32(source["mtp.fc.weight"][1])
    got = dequantize_affine(ours["mtp.fc.weight"][1], ours["mtp.fc.scales"][1], ours["mtp.fc.biases"][1], 4, 32)
    assert np.abs(got - w).max() <= np.abs(w).max() / 7  # one 4-bit step of a group at most
    dropped = _arrays(convert(hf, tmp_path / "dropped", bits=4, group_size=32, mtp="drop"))
    assert sorted(dropped) == sorted(k for k in ours if not k.startswith("mtp."))


def _split_shards(hf, out) -> str:
    """The original with mtp.* in a shard of its own, as Qwen's sharded uploads have it."""
    shutil.copytree(hf, out)
    os.remove(os.path.join(out, "model.safetensors"))
    tensors = {}
    for name, (tag, a) in _arrays(hf).items():
        tensors[name] = (tag, a) if tag == "BF16" else a
    mtp = {k: v for k, v in tensors.items() if k.startswith("mtp.")}
    rest = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    mf.write_safetensors(os.path.join(out, "model-00001-of-00002.safetensors"), rest, metadata={"format": "pt"})
    mf.write_safetensors(os.path.join(out, "model-00002-of-00002.safetensors"), mtp, metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in rest}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in mtp})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return str(out)


def test_add_mtp_reads_only_the_mtp_shards(converted, tmp_path):
    hf, reference = converted("wide_untied_g32")
    sharded = _split_shards(hf, tmp_path / "sharded")
    with open(os.path.join(sharded, "model-00001-of-00002.safetensors"), "wb") as f:
        f.write(b"not read")  # the trunk's shard, which a user need not download
    target = shutil.copytree(reference, tmp_path / "mlx")
    sidecar = add_mtp(sharded, target)
    want = {k: v for k, v in _arrays(convert(hf, tmp_path / "ours", bits=4, group_size=32)).items()
            if k.startswith("mtp.")}
    found, _ = read_safetensors_header(sidecar)
    got = {name: (t.dtype, np.array(tensor_view(t))) for name, t in found.items()}
    assert sorted(got) == sorted(want)
    assert all(got[k][0] == want[k][0] and np.array_equal(got[k][1], want[k][1]) for k in want)
    # An unsharded original works too; an existing sidecar is never overwritten.
    os.remove(sidecar)
    add_mtp(hf, target)
    with pytest.raises(FileExistsError, match="already exists"):
        add_mtp(hf, target)


def test_bad_inputs_name_the_problem(converted, tmp_path):
    hf, reference = converted("base")
    with pytest.raises(metalqwen.CheckpointError, match="already quantized"):
        convert(reference, tmp_path / "x")
    with pytest.raises(FileExistsError, match="already exists"):
        convert(hf, reference)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        convert(hf, tmp_path / "y", bits=3)
    with pytest.raises(metalqwen.CheckpointError, match="no mtp"):
        add_mtp(_split_shards(hf, tmp_path / "nomtp"), shutil.copytree(reference, tmp_path / "m"))
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "y")


def test_the_cli_converts(converted, tmp_path):
    hf, _ = converted("base")
    out = subprocess.run([sys.executable, "-m", "metalqwen.cli", "convert", hf, str(tmp_path / "cli"), "--mtp", "drop"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stderr and os.path.isfile(tmp_path / "cli" / "model.safetensors")
