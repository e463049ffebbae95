"""How checkpoint tensors reach the device (csrc/engine/weights.h), on the CPU runtime:
- a checkpoint written as MLX writes it (unpadded safetensors header: every tensor misaligned
  in the file) is read into a few arena buffers per shard, not one buffer per tensor, and
  computes the same logits bit for bit as the aligned one;
- arenas split at the device's max_buffer_length;
- the load's peak resident memory stays close to the bytes read, as it does when the unaligned
  tensors are read with pread rather than copied out of the mapped file;
- the engine declares its weights, caches and workspace resident, and freed buffers leave.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from metalqwen import gpu
from metalqwen.demo_checkpoint import write_demo_checkpoint
from metalqwen import load

MAX_BUFFER = "METALQWEN_CPU_MAX_BUFFER_BYTES"
PROMPT = [1, 17, 300, 5, 999, 42, 7, 256, 3]


@pytest.fixture(scope="module")
def unaligned_demo(tmp_path_factory):
    """The demo checkpoint (same seed, same tensors) with its header unpadded, as MLX writes it."""
    return write_demo_checkpoint(tmp_path_factory.mktemp("unaligned") / "demo", seed=0, pad_header=False)


def _file_offsets(path) -> list[int]:
    """Each tensor's absolute byte offset in a safetensors file (a folder: its model.safetensors)."""
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return [8 + n + e["data_offsets"][0] for k, e in header.items() if k != "__metadata__"]


def _cpu(monkeypatch, max_buffer=None) -> gpu.Device:
    if max_buffer is None:
        monkeypatch.delenv(MAX_BUFFER, raising=False)
    else:
        monkeypatch.setenv(MAX_BUFFER, str(max_buffer))
    return gpu.Device("cpu")


def test_an_unaligned_checkpoint_loads_into_one_arena_with_the_same_logits(monkeypatch, demo, unaligned_demo):
    offsets = _file_offsets(unaligned_demo)
    assert all(o % 16 for o in offsets), "every tensor is misaligned: none can be wrapped"
    aligned = load(demo, device=_cpu(monkeypatch), max_context=64, progress=False)
    unaligned = load(unaligned_demo, device=_cpu(monkeypatch), max_context=64, progress=False)
    counters = unaligned.counters()
    # One shard smaller than a buffer: a single arena (it was one buffer per tensor: 119).
    assert counters["weight_buffers"] == 1, counters
    assert counters["weight_bytes_copied"] >= os.path.getsize(os.path.join(unaligned_demo, "model.safetensors")) - max(offsets)
    np.testing.assert_array_equal(unaligned.score(PROMPT), aligned.score(PROMPT))


def test_arenas_split_at_the_largest_buffer(monkeypatch, demo, unaligned_demo):
    want = load(demo, device=_cpu(monkeypatch), max_context=64, progress=False).score(PROMPT)
    whole = load(unaligned_demo, device=_cpu(monkeypatch), max_context=64, progress=False).counters()
    limit = whole["weight_bytes_copied"] // 4
    split = load(unaligned_demo, device=_cpu(monkeypatch, max_buffer=limit), max_context=64, progress=False)
    counters = split.counters()
    assert counters["weight_bytes_copied"] == whole["weight_bytes_copied"]
    # At least 4 arenas, and few beyond (each is filled until the next tensor would not fit).
    assert 4 <= counters["weight_buffers"] <= 8, counters
    np.testing.assert_array_equal(split.score(PROMPT), want)


def test_the_load_peak_stays_close_to_the_bytes_read(unaligned_demo):
    """Reading the misaligned tensors through the file mapping would add the mapped pages to the
    resident set on top of the arenas (about twice the weights); pread into the arenas does not.
    Measured in a fresh process: in this one, freed memory of earlier loads would be reused."""
    script = ("import json, sys; from metalqwen import load; "
              "m = load(sys.argv[1], device='cpu', max_context=64, progress=False); "
              "print(json.dumps(m.counters()))")
    env = {**os.environ}
    env.pop(MAX_BUFFER, None)
    out = subprocess.run([sys.executable, "-c", script, os.fspath(unaligned_demo)], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    counters = json.loads(out.strip().splitlines()[-1])
    growth = counters["load_peak_rss"] - counters["load_rss_before"]
    copied = counters["weight_bytes_copied"]
    assert copied * 0.9 <= growth <= copied * 1.1 + 2**20, f"the load grew the resident set by {growth} bytes for {copied} read"


def test_weights_caches_and_workspace_are_declared_resident_until_freed(monkeypatch, unaligned_demo):
    device = _cpu(monkeypatch)
    assert device.resident == (0, 0)
    model = load(unaligned_demo, device=device, max_context=64, progress=False)
    buffers, nbytes = device.resident
    counters = model.counters()
    # The load's estimate is the weights (as placed), the KV cache and the workspace: all declared.
    assert nbytes >= counters["memory_estimate"], (nbytes, counters["memory_estimate"])
    padding = 16 * len(_file_offsets(unaligned_demo))  # at most 15 bytes before each tensor in an arena
    assert nbytes <= counters["memory_estimate"] + padding, "nothing else but the tensors' alignment"
    assert buffers > counters["weight_buffers"]
    del model
    gc.collect()
    assert device.resident == (0, 0), "a freed buffer leaves the resident set"


def test_a_real_mlx_folder_loads_into_a_few_buffers_per_shard(monkeypatch, converted):
    """mlx's own save (mlx-lm convert) writes unpadded headers: the case the arenas are for."""
    mlx = converted("base")[1]
    shards = [name for name in os.listdir(mlx) if name.endswith(".safetensors")]
    misaligned = sum(o % 16 != 0 for shard in shards for o in _file_offsets(os.path.join(mlx, shard)))
    counters = load(mlx, device=_cpu(monkeypatch), max_context=64, progress=False).counters()
    assert counters["weight_buffers"] <= 2 * len(shards), counters
    assert misaligned == 0 or counters["weight_bytes_copied"] > 0
