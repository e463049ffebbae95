"""Device memory limits, simulated on the CPU runtime (a Mac's are maxBufferLength and
recommendedMaxWorkingSetSize; METALQWEN_CPU_MAX_BUFFER_BYTES / METALQWEN_CPU_WORKING_SET_BYTES
lower the CPU runtime's to a small Mac's scale):
- a safetensors shard larger than the largest buffer is wrapped as several buffers split at
  tensor boundaries, and the model computes the same logits;
- a model that does not fit the working set is refused before anything is loaded, with a
  message naming the numbers and the options that lower them;
- the default device and `metalqwen devices` say why Metal is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys

import numpy as np
import pytest

from metalqwen import gpu
from metalqwen.cli import main as cli_main
from metalqwen import load

MAX_BUFFER = "METALQWEN_CPU_MAX_BUFFER_BYTES"
WORKING_SET = "METALQWEN_CPU_WORKING_SET_BYTES"
PROMPT = [1, 17, 300, 5, 999, 42, 7, 256, 3]


def _cpu(monkeypatch, max_buffer=None, working_set=None) -> gpu.Device:
    for name, value in ((MAX_BUFFER, max_buffer), (WORKING_SET, working_set)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    return gpu.Device("cpu")


@pytest.fixture
def aligned_demo(demo, tmp_path):
    """A copy of the demo checkpoint with every tensor 16-byte aligned in the file (header and
    tensors padded), so all are wrapped, none copied: a shard is then split, not copied piecewise."""
    folder = shutil.copytree(demo, tmp_path / "aligned")
    path = folder / "model.safetensors"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    relaid = b""
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if "data_offsets" in kv[1] else -1):
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        relaid += b"\0" * (-len(relaid) % 16)
        entry["data_offsets"] = [len(relaid), len(relaid) + end - begin]
        relaid += data[begin:end]
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 16)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + relaid)
    return folder


def _largest_tensor(folder) -> int:
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return max(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k != "__metadata__")


# ---------------------------------------------------------------------------- the device's limits


def test_cpu_limits_default_to_large_and_the_environment_lowers_them(monkeypatch):
    default = _cpu(monkeypatch)
    assert default.max_buffer_length >= 2**30 and default.recommended_working_set >= 2**30
    small = _cpu(monkeypatch, max_buffer=65536, working_set=10**6)
    assert small.max_buffer_length == 65536 and small.recommended_working_set == 10**6
    assert small.empty(65536).nbytes == 65536
    with pytest.raises(gpu.GpuError, match=r"\[cpu\] a 65537-byte buffer exceeds .*limit of 65536 bytes"):
        small.empty(65537)


@pytest.mark.parametrize("value", ["abc", "0", "-5", "12kb"])
def test_cpu_limit_variables_must_be_byte_counts(monkeypatch, value):
    monkeypatch.setenv(MAX_BUFFER, value)
    with pytest.raises(gpu.GpuError, match=f"{MAX_BUFFER}='{re.escape(value)}' is not a positive number of bytes"):
        gpu.Device("cpu")


# ---------------------------------------------------------------------------- shards beyond max_buffer_length


def test_a_shard_larger_than_the_largest_buffer_is_split_and_gives_the_same_logits(monkeypatch, aligned_demo):
    whole = load(aligned_demo, device=_cpu(monkeypatch), max_context=64, progress=False)
    assert whole.counters()["weight_buffers"] == 1 and whole.counters()["weight_bytes_copied"] == 0
    want = whole.score(PROMPT)

    shard = os.path.getsize(aligned_demo / "model.safetensors")
    limit = max(shard // 5, _largest_tensor(aligned_demo) + 2 * os.sysconf("SC_PAGE_SIZE"))
    assert limit < shard
    split = load(aligned_demo, device=_cpu(monkeypatch, max_buffer=limit), max_context=64, progress=False)
    counters = split.counters()
    assert counters["weight_bytes_copied"] == 0, "split at tensor boundaries, never copied"
    assert counters["weight_buffers"] >= -(-shard // limit)
    np.testing.assert_array_equal(split.score(PROMPT), want)


def test_a_tensor_larger_than_the_largest_buffer_is_refused_by_name(monkeypatch, aligned_demo):
    limit = _largest_tensor(aligned_demo) - 1
    with pytest.raises(gpu.GpuError, match=rf"\[weights\] tensor \S+ is {limit + 1} bytes, more than .*\({limit} bytes\)"):
        load(aligned_demo, device=_cpu(monkeypatch, max_buffer=limit), max_context=64, progress=False)


# ---------------------------------------------------------------------------- the working set


def _mapped(path) -> bool:
    with open("/proc/self/maps") as f:
        return os.fspath(path) in f.read()


def test_a_model_beyond_the_working_set_is_refused_before_loading(monkeypatch, demo):
    need = load(demo, device=_cpu(monkeypatch), max_context=512, progress=False).counters()["memory_estimate"]
    # Exactly the estimate fits; a byte less is refused.
    load(demo, device=_cpu(monkeypatch, working_set=need), max_context=512, progress=False)
    device = _cpu(monkeypatch, working_set=need - 1)
    with pytest.raises(gpu.GpuError) as refused:
        load(demo, device=device, max_context=512, kv_bits=16, progress=False)
    message = str(refused.value)
    needed = int(re.match(r"\[engine\] the model does not fit in GPU memory: it needs \S+ MiB \((\d+) bytes: weights ",
                          message).group(1))
    assert needed > need, "the f16 cache needs more than the q8 one"
    assert f"({need - 1} bytes, its recommended working set)" in message, message
    assert "KV cache" in message and "at max_context 512" in message and "kv_bits=8" in message, message

    # The context it names as the largest that fits does fit, and one token more does not.
    fits = int(re.search(r"Lower max_context \(up to (\d+) fits\)", message).group(1))
    assert 2 <= fits < 512
    load(demo, device=device, max_context=fits, kv_bits=16, progress=False)
    with pytest.raises(gpu.GpuError, match="does not fit"):
        load(demo, device=device, max_context=fits + 1, kv_bits=16, progress=False)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
def test_a_refused_model_loads_nothing_and_leaves_nothing_mapped(monkeypatch, demo, tmp_path, capsys):
    import gc

    private = shutil.copytree(demo, tmp_path / "private")  # other tests keep models of `demo` loaded
    shard = private / "model.safetensors"
    with pytest.raises(gpu.GpuError, match="does not fit"):
        load(private, device=_cpu(monkeypatch, working_set=4096), max_context=512, progress=True)
    assert "loading onto" not in capsys.readouterr().err, "refused only after placing weights"
    gc.collect()
    assert not _mapped(shard), "the refused load left the checkpoint mapped"
    # The control: an admitted load reports progress and maps the file, so both checks can fail.
    model = load(private, device=_cpu(monkeypatch), max_context=512, progress=True)
    assert "loading onto" in capsys.readouterr().err
    assert _mapped(shard)
    del model


def test_weights_that_do_not_fit_at_any_context_say_so(monkeypatch, demo):
    with pytest.raises(gpu.GpuError, match="Even the weights and workspace do not fit"):
        load(demo, device=_cpu(monkeypatch, working_set=4096), max_context=512, progress=False)


# ---------------------------------------------------------------------------- the default device


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS the build has no Metal backend")
def test_without_metal_the_default_is_the_cpu_runtime_and_the_reason_is_given(capsys):
    reason = gpu.metal_unavailable_reason()
    assert reason == "[gpu] this build has no Metal backend (Metal exists only on macOS)"
    assert gpu.available_kinds() == ["cpu"]
    assert gpu.Device().kind == "cpu"
    with pytest.raises(gpu.GpuError, match="no Metal backend"):
        gpu.Device("metal")
    assert cli_main(["devices"]) == 0
    out = capsys.readouterr().out
    assert f"metal  unavailable: {reason}" in out and "default: cpu" in out
