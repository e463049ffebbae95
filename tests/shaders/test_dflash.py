"""shaders/dflash.metal: the DFlash drafter's kernels against float64 numpy (math:
csrc/engine/dflash.h). The capture is an exact f32 add into its columns; the q/k head norm +
split-half RoPE over the whole head + cache append handles rows of two segments (slots, positions)
and leaves every other cache row untouched; the block attention has no mask and groups query
heads over kv heads. Head dims 64, 128 (the published drafters') and 256 (the kernels' maximum)."""

import math

import numpy as np
import pytest

from ..support import reference as ref
from .attention_reference import seeded
from .params import step_segments

CAPTURE = np.dtype([(n, "<u4") for n in ("dim", "rows", "out_stride", "col0")])
PREP = np.dtype([(n, "<u4") for n in ("nq", "nkv", "head_dim", "q_stride", "kv_stride", "slot_floats")] +
                [("eps", "<f4"), ("log2_theta", "<f4")])
ATTN = np.dtype([(n, "<u4") for n in ("nq", "nkv", "head_dim", "n_keys", "q_stride", "out_stride")] +
                [("scale", "<f4")])
THETA, EPS = 1e6, 1e-6


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("dflash.metal")


def test_capture_adds_into_its_columns(dev, lib):
    rng = seeded("capture")
    rows, dim, n = 5, 96, 3
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    mix = rng.standard_normal((rows, dim)).astype(np.float32)
    out = dev.buffer(np.full((rows, n * dim), np.nan, np.float32))
    params = np.array([(dim, rows, n * dim, dim)], CAPTURE)  # column block 1
    lib.kernel("dflash_capture").dispatch_threads({0: dev.buffer(x), 1: dev.buffer(mix), 2: out, 3: params},
                                                  grid=(dim + 7, rows + 1), threads=(32, 2))
    got = out.numpy(np.float32, (rows, n * dim))
    np.testing.assert_array_equal(got[:, dim:2 * dim], x + mix)
    assert np.isnan(got[:, :dim]).all() and np.isnan(got[:, 2 * dim:]).all()


def rms_rope(x, w, pos, hd):
    """float64: rms(x) * w per head, then split-half RoPE at `pos` over the whole head."""
    y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS) * w
    inv = THETA ** (-np.arange(0, hd, 2) / hd)
    ang = pos * inv
    a, b = y[..., : hd // 2], y[..., hd // 2:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)


@pytest.mark.parametrize("wf32", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_qk_norm_rope_appends_at_each_rows_slot_and_position(dev, lib, hd, wf32):
    rng = seeded("prep", hd, wf32)
    nq, nkv, ctx = 4, 2, 320
    segs = [(1, 3, 300), (0, 2, 7)]  # (slot, rows, position): slot 1 first, slot 0 after
    rows = sum(s[1] for s in segs)
    q = rng.standard_normal((rows, nq * hd)).astype(np.float32)
    k = rng.standard_normal((rows, nkv * hd)).astype(np.float32) * 3
    v = rng.standard_normal((rows, nkv * hd)).astype(np.float32)
    wq, wk = 1 + 0.2 * rng.standard_normal(hd), 1 + 0.2 * rng.standard_normal(hd)
    if wf32:
        (wq_buf, wq), (wk_buf, wk) = [(w.astype(np.float32), w.astype(np.float32).astype(np.float64)) for w in (wq, wk)]
    else:
        (wq_buf, wq), (wk_buf, wk) = [(ref.bf16_bits(w), ref.bf16_to_f32(ref.bf16_bits(w)).astype(np.float64))
                                      for w in (wq, wk)]
    slot_floats = ctx * nkv * hd
    q_buf = dev.buffer(q)
    k_cache = dev.buffer(np.full(2 * slot_floats, np.nan, np.float32))
    v_cache = dev.buffer(np.full(2 * slot_floats, np.nan, np.float32))
    params = np.array([(nq, nkv, hd, nq * hd, nkv * hd, slot_floats, EPS, math.log2(THETA))], PREP)
    name = "dflash_qk_norm_rope" + ("_wf32" if wf32 else "")
    lib.kernel(name).dispatch({0: q_buf, 1: dev.buffer(k), 2: dev.buffer(v), 3: dev.buffer(wq_buf),
                               4: dev.buffer(wk_buf), 5: k_cache, 6: v_cache, 7: step_segments(*segs), 8: params},
                              threadgroups=(nq + nkv, rows), threads=(32, 1))
    got_q = q_buf.numpy(np.float32, (rows, nq, hd))
    kc = k_cache.numpy(np.float32, (2, ctx, nkv, hd))
    vc = v_cache.numpy(np.float32, (2, ctx, nkv, hd))
    written = np.zeros((2, ctx), bool)
    r = 0
    for slot, n, position in segs:
        for i in range(n):
            pos = position + i
            want_q = rms_rope(q[r].reshape(nq, hd).astype(np.float64), wq, pos, hd)
            want_k = rms_rope(k[r].reshape(nkv, hd).astype(np.float64), wk, pos, hd)
            # f32 rounding, the angle's f32 product at positions up to 300: 2e-5 of the values.
            ref.assert_close(got_q[r], want_q, 2e-5, f"q row {r}")
            ref.assert_close(kc[slot, pos], want_k, 2e-5, f"k row {r} (slot {slot}, position {pos})")
            np.testing.assert_array_equal(vc[slot, pos], v[r].reshape(nkv, hd))
            written[slot, pos] = True
            r += 1
    assert np.isnan(kc[~written]).all() and np.isnan(vc[~written]).all()


@pytest.mark.parametrize("n_keys", [1, 37, 300])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_attention_has_no_mask_and_groups_heads(dev, lib, hd, n_keys):
    rng = seeded("attention", hd, n_keys)
    nq, nkv, rows = 6, 2, 5
    q = rng.standard_normal((rows, nq * hd)).astype(np.float32)
    k = (rng.standard_normal((n_keys + 3, nkv * hd)) * 0.2).astype(np.float32)  # rows past n_keys: never read
    v = rng.standard_normal((n_keys + 3, nkv * hd)).astype(np.float32)
    k[n_keys:], v[n_keys:] = np.nan, np.nan
    out = dev.buffer(np.full((rows, nq * hd), np.nan, np.float32))
    scale = 1 / math.sqrt(hd)
    params = np.array([(nq, nkv, hd, n_keys, nq * hd, nq * hd, scale)], ATTN)
    lib.kernel("dflash_attention").dispatch({0: dev.buffer(q), 1: dev.buffer(k), 2: dev.buffer(v), 3: out, 4: params},
                                            threadgroups=(nq, rows), threads=(32, 1))
    got = out.numpy(np.float32, (rows, nq, hd))
    q64 = q.reshape(rows, nq, hd).astype(np.float64)
    k64 = k[:n_keys].reshape(n_keys, nkv, hd).astype(np.float64)
    v64 = v[:n_keys].reshape(n_keys, nkv, hd).astype(np.float64)
    kv_of = np.arange(nq) // (nq // nkv)
    s = np.einsum("rhd,thd->rht", q64, k64[:, kv_of]) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("rht,thd->rhd", p, v64[:, kv_of])
    ref.assert_close(got, want, 1e-5, "attention")
