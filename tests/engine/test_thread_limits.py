"""Per-pipeline thread limits, as Metal reports them (maxTotalThreadsPerThreadgroup drops
for kernels with many registers), and what the engine makes of them.

METALQWEN_CPU_MAX_THREADS=N makes the CPU runtime report min(N, declared) for every
pipeline; [[max_total_threads_per_threadgroup]] is a maximum, not a promise (MSL spec
5.1.3), so the cap applies to declared kernels too. The engine creates every pipeline
at load, fits each dispatch into its pipeline's limit, and refuses at load, naming the
kernels, when a limit is below what a kernel needs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import metalqwen
from metalqwen import gpu
from metalqwen.demo_checkpoint import write_demo_checkpoint

ENV = "METALQWEN_CPU_MAX_THREADS"

LIMITS_MSL = """
[[max_total_threads_per_threadgroup(64)]]
kernel void small(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = i; }
[[max_total_threads_per_threadgroup(512)]]
kernel void large(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = i; }
kernel void plain(device uint* y [[buffer(0)]], uint i [[thread_position_in_grid]],
                  uint n [[threads_per_threadgroup]]) { y[i] = n; }
"""


def capped_device(monkeypatch, cap: str | None) -> gpu.Device:
    """A CPU device opened with METALQWEN_CPU_MAX_THREADS=cap (unset for None)."""
    if cap is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, cap)
    return gpu.Device("cpu")


def limits(dev: gpu.Device) -> dict[str, int]:
    lib = dev.compile(LIMITS_MSL, "limits.metal")
    return {name: lib.kernel(name).max_threads_per_threadgroup for name in ("small", "large", "plain")}


def test_cap_lowers_every_pipeline_limit_declared_or_not(monkeypatch):
    assert limits(capped_device(monkeypatch, None)) == {"small": 64, "large": 512, "plain": 1024}
    assert limits(capped_device(monkeypatch, "96")) == {"small": 64, "large": 96, "plain": 96}
    assert limits(capped_device(monkeypatch, "1024")) == {"small": 64, "large": 512, "plain": 1024}


def test_dispatch_above_the_lowered_limit_is_refused_naming_the_kernel(monkeypatch):
    dev = capped_device(monkeypatch, "96")
    lib = dev.compile(LIMITS_MSL, "limits.metal")
    y = dev.empty(4 * 1024)
    with pytest.raises(gpu.GpuError, match=r"kernel 'plain': 128 threads per threadgroup exceed its maximum of 96"):
        lib.kernel("plain").dispatch({0: y}, threadgroups=(1,), threads=(128,))
    with pytest.raises(gpu.GpuError, match=r"kernel 'large': 97 threads per threadgroup exceed its maximum of 96"):
        lib.kernel("large").dispatch({0: y}, threadgroups=(1,), threads=(97,))
    lib.kernel("plain").dispatch({0: y}, threadgroups=(2,), threads=(96,))
    np.testing.assert_array_equal(y.numpy(np.uint32, (192,)), np.full(192, 96, np.uint32))


@pytest.mark.parametrize("value", ["0", "1025", "-5", "64x", "abc", " 64"])
def test_bad_cap_is_refused_when_the_device_opens(monkeypatch, value):
    with pytest.raises(gpu.GpuError, match=rf"METALQWEN_CPU_MAX_THREADS='{re.escape(value)}' is not an integer in 1\.\.1024"):
        capped_device(monkeypatch, value)


# ------------------------------------------------------------------------ the engine


@pytest.fixture(scope="module")
def many_heads(tmp_path_factory):
    """16 query heads per kv head: the engine's attention wants 512 threads (16 SIMD-groups)."""
    folder = tmp_path_factory.mktemp("many_heads")
    return write_demo_checkpoint(folder, seed=5, num_hidden_layers=2, full_attention_interval=2,
                                 num_attention_heads=16, num_key_value_heads=1)


def load(path, dev):
    return metalqwen.load(path, device=dev, max_context=140, kv_bits=16, progress=False)


# 132 tokens: prefill chunks of 64 rows, then decode past 128 positions (split flash-decode).
PROMPT = [int(t) for t in np.random.default_rng(1).integers(0, 1000, 132)]
GREEDY = dict(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def uncapped(many_heads):
    """(logits at every position, greedy tokens) of the engine without a cap."""
    with pytest.MonkeyPatch.context() as mp:
        model = load(many_heads, capped_device(mp, None))
    return model.score(PROMPT), model.generate(PROMPT, **GREEDY).tokens


def test_load_fails_naming_each_kernel_whose_limit_is_too_small(monkeypatch, many_heads):
    # qmm needs exactly 128 threads; qmv and embed (64) fit, the other kernels take fewer.
    with pytest.raises(gpu.GpuError) as err:
        load(many_heads, capped_device(monkeypatch, "96"))
    message = str(err.value)
    assert message.startswith("[engine] this GPU cannot run the model's kernels:")
    assert "kernel 'qmm_b4_g64' allows at most 96 threads per threadgroup and needs 128" in message
    assert "qmv" not in message and "embed" not in message and "attn" not in message
    with pytest.raises(gpu.GpuError, match=r"kernel 'embed_b4_g64' allows at most 32 threads per threadgroup "
                                           r"and needs 64.*kernel 'qmm_b4_g64' allows at most 32"):
        load(many_heads, capped_device(monkeypatch, "32"))


@pytest.mark.parametrize("cap", ["256", "384"])
def test_engine_under_a_cap_gives_the_same_bits(monkeypatch, many_heads, uncapped, cap):
    """Under a cap the attention splits the 16 heads into blocks (of 8, or 12 + 4), the scan
    takes several row blocks per SIMD-group (16 over 8 or 12): each output is computed in
    the same order, so the logits are bit-identical to the uncapped engine's."""
    model = load(many_heads, capped_device(monkeypatch, cap))
    np.testing.assert_array_equal(model.score(PROMPT), uncapped[0])
    assert model.generate(PROMPT, **GREEDY).tokens == uncapped[1]
    # The sampler shrinks from 1024 threads: a draw is reproducible under the cap.
    sampled = dict(max_tokens=3, temperature=0.8, top_k=20, seed=3)
    assert model.generate(PROMPT[:8], **sampled).tokens == model.generate(PROMPT[:8], **sampled).tokens


def test_engine_under_a_cap_below_the_norm_size_stays_close(monkeypatch, many_heads, uncapped):
    """At 128 threads the RMSNorms (256 by default) also shrink and sum in another order:
    f32 rounding only (measured 7e-6 of the largest logit), and the same greedy tokens."""
    model = load(many_heads, capped_device(monkeypatch, "128"))
    got, want = model.score(PROMPT), uncapped[0]
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 5e-5, f"logits differ by {err:.3g} under a 128-thread cap"
    assert model.generate(PROMPT, **GREEDY).tokens == uncapped[1]
