"""shaders/norm.metal: RMSNorm (plain and fused with the residual add), silu(gate) * up,
and the residual add.

Compared with float64 numpy from docs/design.md, "Every layer": rms(x) = x * rsqrt(mean(x^2) + eps)
times the stored (already shifted) bf16 weight; MLP activation silu(gate) * up. Rows are
strided with NaN padding that must neither be read (it would poison the result) nor
written; outputs start as NaN. Sizes: rows 1, 7, 33 x hidden 32, 1024, 5120 (27B), the
fused [gate | up] projection layout, intermediate 17408 (27B).
"""

import numpy as np
import pytest

from ..support import reference as ref
from .attention_reference import seeded

BF16 = np.uint16  # bf16 tensors travel as their bit patterns
EPS = 1e-6

# struct RmsNormParams { uint dim, x_stride, r_stride, y_stride; float eps; }
RMS_PARAMS = np.dtype([("dim", "<u4"), ("x_stride", "<u4"), ("r_stride", "<u4"), ("y_stride", "<u4"), ("eps", "<f4")])
# struct SiluMulParams { uint n, rows, gate_stride, up_stride, out_stride; }
# struct ResidualAddParams { uint n; }
NORM_THREADS = 256  # MQ_NORM_THREADS

# Tolerances (elementwise, relative to each expected value).
# RMSNorm, f32: the sum of squares of positive terms has relative error <= (adds on the
# longest path) u: <= 160 sequential adds per thread (dim 5120 over 32 threads) plus
# 10 tree levels; rsqrt halves that and adds 2 ulp (fast math); three products 3 u.
# Together < 1e-5; a half-precision step (5e-4) or a wrong mean (dim off by one: 2e-4
# at dim 5120) fails.
TOL_NORM = 1e-5
# silu through exp: fast-math exp is within (3 + 2|x|) ulp (<= 63 ulp = 4e-6 for the
# |x| <= 30 that is not clamped away), the division 2.5 ulp, the product 1: 2e-5.
TOL_SILU = 2e-5
TINY = 1e-30  # absolute floor: silu(-100) ~ 4e-42 is a denormal the GPU may flush


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("norm.metal")


def activations(rng, rows, n):
    """Hidden-state-like rows: N(0, 1) with a few large channels shared by all rows."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    cols = rng.choice(n, size=min(4, n), replace=False)
    x[:, cols] *= 20.0
    return x


def padded(a, stride, fill=np.nan):
    out = np.full((a.shape[0], stride), fill, np.float32)
    out[:, :a.shape[1]] = a
    return out


def rms_reference(x, w):
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * ref.bf16_to_f32(w).astype(np.float64)


def rms_params(dim, x_stride, r_stride, y_stride):
    return np.array([(dim, x_stride, r_stride, y_stride, EPS)], dtype=RMS_PARAMS)


# ---------------------------------------------------------------------------
# RMSNorm


@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("dim", [32, 1024, 5120])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(dev, lib, rows, dim, residual):
    rng = seeded("rms", rows, dim, residual)
    x = activations(rng, rows, dim)
    r = activations(rng, rows, dim)
    w = ref.bf16_bits(rng.normal(1.0, 0.4, dim))  # stored shifted (1 + w): multiplied as is
    x_stride, r_stride, y_stride = dim + 4, dim + 12, dim + 8
    xbuf = dev.buffer(padded(x, x_stride))
    ybuf = dev.buffer(np.full((rows, y_stride), np.nan, np.float32))
    if residual:
        lib.kernel("rms_norm_residual").dispatch(
            {0: xbuf, 1: dev.buffer(padded(r, r_stride)), 2: dev.buffer(w), 3: ybuf,
             4: rms_params(dim, x_stride, r_stride, y_stride)},
            threadgroups=(rows,), threads=(NORM_THREADS,))
        h = x + r  # the residual stream is f32: one rounding, as the kernel's add
        got_x = xbuf.numpy(np.float32, (rows, x_stride))
        assert np.array_equal(got_x[:, :dim], h), "x += r is not the f32 sum"
        ref.assert_untouched(got_x[:, dim:], "x row padding")
    else:
        lib.kernel("rms_norm").dispatch(
            {0: xbuf, 1: dev.buffer(w), 2: ybuf, 3: rms_params(dim, x_stride, 0, y_stride)},
            threadgroups=(rows,), threads=(NORM_THREADS,))
        h = x
    got = ybuf.numpy(np.float32, (rows, y_stride))
    want = rms_reference(h, w)
    ref.assert_within(got[:, :dim], want, TOL_NORM * np.abs(want) + TINY, "rms_norm y")
    ref.assert_untouched(got[:, dim:], "y row padding")


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_wf32_reads_f32_weights(dev, lib, residual):
    """rms_norm(_residual)_wf32 (f32 norm weights, as f32 or f16 checkpoints give them) reproduce
    the bf16 variants bit for bit on the same values."""
    rng = seeded("rms-wf32", residual)
    rows, dim = 3, 1024
    x, r = activations(rng, rows, dim), activations(rng, rows, dim)
    w = ref.bf16_bits(rng.normal(1.0, 0.4, dim))
    outs = []
    for suffix, wbuf in [("", dev.buffer(w)), ("_wf32", dev.buffer(ref.bf16_to_f32(w)))]:
        xbuf, ybuf = dev.buffer(x), dev.buffer(np.full((rows, dim), np.nan, np.float32))
        if residual:
            lib.kernel("rms_norm_residual" + suffix).dispatch(
                {0: xbuf, 1: dev.buffer(r), 2: wbuf, 3: ybuf, 4: rms_params(dim, dim, dim, dim)},
                threadgroups=(rows,), threads=(NORM_THREADS,))
        else:
            lib.kernel("rms_norm" + suffix).dispatch({0: xbuf, 1: wbuf, 2: ybuf, 3: rms_params(dim, dim, 0, dim)},
                                                     threadgroups=(rows,), threads=(NORM_THREADS,))
        outs.append(ybuf.numpy(np.float32, (rows, dim)))
    assert np.isfinite(outs[0]).all() and np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("threads", [32, 96, 1024])
def test_rms_norm_any_threadgroup_size(dev, lib, threads):
    """The reduction works for any multiple of 32 threads, more or fewer than dim; y may alias x."""
    rows, dim = 3, 1056
    rng = seeded("rms-threads", threads)
    x = activations(rng, rows, dim)
    w = ref.bf16_bits(rng.normal(1.0, 0.4, dim))
    xbuf = dev.buffer(x)
    lib.kernel("rms_norm").dispatch({0: xbuf, 1: dev.buffer(w), 2: xbuf, 3: rms_params(dim, dim, 0, dim)},
                                    threadgroups=(rows,), threads=(threads,))
    want = rms_reference(x, w)
    got = xbuf.numpy(np.float32, (rows, dim))
    ref.assert_within(got, want, TOL_NORM * np.abs(want) + TINY, "rms_norm in place")


# ---------------------------------------------------------------------------
# silu(gate) * up


def silu_reference(g, u):
    g = np.asarray(g, dtype=np.float64)
    return g / (1.0 + np.exp(-g)) * np.asarray(u, dtype=np.float64)


def gate_values(rng, rows, n):
    g = (rng.standard_normal((rows, n)) * 3.0).astype(np.float32)
    extremes = np.array([-100.0, 100.0, -30.0, 30.0, 0.0], np.float32)  # clamp, saturation, zero
    g.flat[np.linspace(0, g.size - 1, extremes.size).astype(int)] = extremes
    return g


@pytest.mark.parametrize("rows,n", [(1, 4), (7, 36), (33, 3584), (2, 17408)])
@pytest.mark.parametrize("fused", [False, True])
def test_silu_mul(dev, lib, rows, n, fused):
    rng = seeded("silu", rows, n, fused)
    g = gate_values(rng, rows, n)
    u = rng.standard_normal((rows, n)).astype(np.float32)
    out_stride = n + 8
    out = dev.buffer(np.full((rows, out_stride), np.nan, np.float32))
    if fused:  # one projection output [rows][gate | up], up bound at an offset
        gu = dev.buffer(np.concatenate([g, u], axis=1))
        gate_arg, up_arg, strides = gu, (gu, 4 * n), (2 * n, 2 * n)
    else:
        gate_arg, up_arg, strides = dev.buffer(padded(g, n + 4)), dev.buffer(padded(u, n + 12)), (n + 4, n + 12)
    params = np.array([n, rows, strides[0], strides[1], out_stride], dtype=np.uint32)
    lib.kernel("silu_mul").dispatch_threads({0: gate_arg, 1: up_arg, 2: out, 3: params},
                                            grid=(n // 4, rows), threads=(64, 1))
    got = out.numpy(np.float32, (rows, out_stride))
    want = silu_reference(g, u)
    ref.assert_within(got[:, :n], want, TOL_SILU * np.abs(want) + TINY, "silu(gate) * up")
    ref.assert_untouched(got[:, n:], "out row padding")


def test_silu_mul_in_place_over_gate(dev, lib):
    """out may alias gate (the engine can reuse the projection buffer)."""
    rows, n = 3, 64
    rng = seeded("silu-alias")
    g = gate_values(rng, rows, n)
    u = rng.standard_normal((rows, n)).astype(np.float32)
    gu = dev.buffer(np.concatenate([g, u], axis=1))
    params = np.array([n, rows, 2 * n, 2 * n, 2 * n], dtype=np.uint32)
    lib.kernel("silu_mul").dispatch_threads({0: gu, 1: (gu, 4 * n), 2: gu, 3: params}, grid=(n // 4, rows),
                                            threads=(8, 2))
    got = gu.numpy(np.float32, (rows, 2 * n))
    want = silu_reference(g, u)
    ref.assert_within(got[:, :n], want, TOL_SILU * np.abs(want) + TINY, "silu in place")
    assert np.array_equal(got[:, n:], u)


# ---------------------------------------------------------------------------
# Residual add


@pytest.mark.parametrize("n", [1, 7, 33, 5120 * 3 + 3])
def test_residual_add(dev, lib, n):
    rng = seeded("residual", n)
    x = activations(rng, 1, n)[0]
    r = activations(rng, 1, n)[0]
    guard = 9
    xbuf = dev.buffer(np.concatenate([x, np.full(guard, 7.0, np.float32)]))
    rbuf = dev.buffer(np.concatenate([r, np.ones(guard, np.float32)]))
    lib.kernel("residual_add").dispatch_threads({0: xbuf, 1: rbuf, 2: np.array([n], np.uint32)},
                                                grid=(-(-n // 4),), threads=(32,))
    got = xbuf.numpy(np.float32, (n + guard,))
    assert np.array_equal(got[:n], x + r), "x += r is not the f32 sum"
    assert np.all(got[n:] == 7.0), "written past n"
