"""shaders/vision.metal: the vision tower's kernels against float64 numpy.

The math is mlx-vlm 0.7.10's Qwen3-VL tower (docs/images.md): linear + bias with a tanh-GELU,
exact-GELU or residual epilogue, LayerNorm (eps 1e-6), the learned position grid's bilinear
gather, the 2-D rotary embedding (height, then width, over head_dim / 2), and full attention
over one image's rows. Sizes straddle the 32-wide tiles (rows 1, 37; in 48 and 1536, the patch
row; out 40) and the lanes of a head (head_dim 16, 72 as Qwen3.5's, 128 the kernel's maximum).
Outputs start as NaN; every element is compared. The slow cases are Qwen3.5's sizes (hidden 1152,
MLP 4304, 16 heads of 72).
"""

import math

import numpy as np
import pytest

from ..support import reference as ref
from .attention_reference import seeded

LIN = np.dtype([("rows", "<u4"), ("in", "<u4"), ("out", "<u4"), ("x_stride", "<u4"), ("y_stride", "<u4")])
NORM = np.dtype([("dim", "<u4"), ("x_stride", "<u4"), ("y_stride", "<u4"), ("eps", "<f4")])
POS = np.dtype([("rows", "<u4"), ("hidden", "<u4")])
ROPE = np.dtype([("rows", "<u4"), ("heads", "<u4"), ("head_dim", "<u4"), ("qkv_stride", "<u4")])
ATTN = np.dtype([("rows", "<u4"), ("heads", "<u4"), ("head_dim", "<u4"), ("qkv_stride", "<u4"),
                 ("out_stride", "<u4"), ("scale", "<f4")])
TILE, LINEAR_THREADS = 32, 256  # MQ_VISION_TILE, MQ_VISION_LINEAR_THREADS
EPS = 1e-6

# f32 sums of up to 1536 products (k in order, fma): relative error about in * u of the sum of
# |products|; the bounds below are taken against that sum (ref.typical_dot-like scale), so a
# dropped term, a wrong bias or a bf16-rounded activation fails.
TOL_DOT = 2e-6


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("vision.metal")


def store(w, fmt):
    """A float64 matrix as the kernels read format `fmt`: (buffer array, the values it holds)."""
    if fmt == "bf16":
        bits = ref.bf16_bits(w)
        return bits, ref.bf16_to_f32(bits).astype(np.float64)
    if fmt == "f16":
        h = np.asarray(w, np.float16)
        return h, h.astype(np.float64)
    f = np.asarray(w, np.float32)
    return f, f.astype(np.float64)


def gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def gelu_erf(v):
    return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))


@pytest.mark.parametrize("fmt", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("epilogue", ["", "gelu_tanh_", "gelu_erf_", "residual_"])
@pytest.mark.parametrize("rows,inp,out", [(1, 48, 40), (37, 1536, 72)])
def test_vision_linear(dev, lib, fmt, epilogue, rows, inp, out):
    check_linear(dev, lib, fmt, epilogue, rows, inp, out)


@pytest.mark.slow
def test_vision_linear_at_qwen35_size(dev, lib):
    check_linear(dev, lib, "bf16", "residual_", 33, 4304, 1152)  # the blocks' fc2


def check_linear(dev, lib, fmt, epilogue, rows, inp, out):
    rng = seeded("vision-linear", fmt, epilogue, rows, inp)
    x = rng.standard_normal((rows, inp)).astype(np.float32)
    w_arr, w = store(rng.standard_normal((out, inp)) / math.sqrt(inp), fmt)
    b_arr, b = store(rng.standard_normal(out), "bf16" if fmt == "bf16" else "f32")
    x_stride, y_stride = inp + 8, out + 4
    xp = np.full((rows, x_stride), np.nan, np.float32)
    xp[:, :inp] = x
    y0 = rng.standard_normal((rows, y_stride)).astype(np.float32) if epilogue == "residual_" else \
        np.full((rows, y_stride), np.nan, np.float32)
    ybuf = dev.buffer(y0)
    lib.kernel(f"vision_linear_{epilogue}{fmt}").dispatch(
        {0: dev.buffer(xp), 1: dev.buffer(w_arr), 2: dev.buffer(b_arr), 3: ybuf,
         4: np.array([(rows, inp, out, x_stride, y_stride)], LIN)},
        threadgroups=(-(-out // TILE), -(-rows // TILE)), threads=(LINEAR_THREADS,))
    got = ybuf.numpy(np.float32, (rows, y_stride))
    pre = x.astype(np.float64) @ w.T + b
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + np.abs(b)
    want = {"": pre, "gelu_tanh_": gelu_tanh(pre), "gelu_erf_": gelu_erf(pre), "residual_": y0[:, :out] + pre}[epilogue]
    # GELU's slope is at most 1.13, erf/tanh add a few ulp of their value.
    carried = np.abs(y0[:, :out]) if epilogue == "residual_" else 0.0
    ref.assert_within(got[:, :out], want, TOL_DOT * (scale + carried) + 4e-7 * np.abs(want),
                      f"vision_linear_{epilogue}{fmt}")
    assert np.array_equal(got[:, out:], y0[:, out:], equal_nan=True), "y row padding written"


def test_gelu_erf_near_zero_and_tails(dev, lib):
    """The exact GELU's erf across its two polynomial branches (|z| <= 0.9277) and the tails."""
    z = np.concatenate([np.linspace(-6, 6, 97), [-0.9277, 0.9277, 0.93, -1e-3, 1e-3, 0.0]]).astype(np.float32)
    n = z.size
    ybuf = dev.buffer(np.full((n, 1), np.nan, np.float32))
    # y = gelu(x * 1 + 0): a 1 x 1 weight of one and a zero bias.
    lib.kernel("vision_linear_gelu_erf_f32").dispatch(
        {0: dev.buffer(z.reshape(n, 1)), 1: dev.buffer(np.ones((1, 1), np.float32)),
         2: dev.buffer(np.zeros(1, np.float32)), 3: ybuf, 4: np.array([(n, 1, 1, 1, 1)], LIN)},
        threadgroups=(1, -(-n // TILE)), threads=(LINEAR_THREADS,))
    want = gelu_erf(z.astype(np.float64))
    ref.assert_within(ybuf.numpy(np.float32, (n,)), want, 3e-7 * np.abs(z) + 1e-30, "exact GELU")


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dim,threads", [(32, 32), (1152, 256)])
def test_vision_layer_norm(dev, lib, wide, dim, threads):
    rng = seeded("vision-ln", wide, dim)
    rows = 5
    x = (rng.standard_normal((rows, dim)) * 3 + 2).astype(np.float32)
    w_arr, w = store(rng.normal(1, 0.3, dim), "f32" if wide else "bf16")
    b_arr, b = store(rng.normal(0, 0.3, dim), "f32" if wide else "bf16")
    ybuf = dev.buffer(np.full((rows, dim + 4), np.nan, np.float32))
    lib.kernel("vision_layer_norm" + ("_wf32" if wide else "")).dispatch(
        {0: dev.buffer(x), 1: dev.buffer(w_arr), 2: dev.buffer(b_arr), 3: ybuf,
         4: np.array([(dim, dim, dim + 4, EPS)], NORM)}, threadgroups=(rows,), threads=(threads,))
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    normed = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + EPS)
    want = normed * w + b
    got = ybuf.numpy(np.float32, (rows, dim + 4))
    ref.assert_within(got[:, :dim], want, 2e-5 * (np.abs(normed * w) + np.abs(b)), "vision_layer_norm")
    ref.assert_untouched(got[:, dim:], "y row padding")


@pytest.mark.parametrize("fmt", ["bf16", "f16", "f32"])
def test_vision_pos_embed(dev, lib, fmt):
    rng = seeded("vision-pos", fmt)
    n, hidden, rows = 16, 40, 12
    t_arr, table = store(rng.standard_normal((n, hidden)), fmt)
    index = rng.integers(0, n, (rows, 4)).astype(np.uint32)
    weight = rng.random((rows, 4)).astype(np.float32)
    xbuf = dev.buffer(np.full((rows, hidden), np.nan, np.float32))
    lib.kernel(f"vision_pos_embed_{fmt}").dispatch_threads(
        {0: dev.buffer(t_arr), 1: dev.buffer(index), 2: dev.buffer(weight), 3: xbuf,
         4: np.array([(rows, hidden)], POS)}, grid=(hidden, rows), threads=(32, 4))
    want = np.einsum("rc,rch->rh", weight.astype(np.float64), table[index])
    ref.assert_within(xbuf.numpy(np.float32, (rows, hidden)), want, 1e-6 * np.abs(table[index]).sum(1).max(),
                      "vision_pos_embed")


def rope_reference(qkv, pos, inv_freq, heads, hd):
    out = qkv.astype(np.float64).copy()
    quarter, half = hd // 4, hd // 2
    for part in range(2):
        for h in range(heads):
            base = (part * heads + h) * hd
            i = np.arange(half)
            angle = np.where(i < quarter, pos[:, :1], pos[:, 1:]) * inv_freq.astype(np.float64)[i % quarter]
            x1, x2 = qkv[:, base:base + half].astype(np.float64), qkv[:, base + half:base + hd].astype(np.float64)
            out[:, base:base + half] = x1 * np.cos(angle) - x2 * np.sin(angle)
            out[:, base + half:base + hd] = x2 * np.cos(angle) + x1 * np.sin(angle)
    return out


@pytest.mark.parametrize("heads,hd", [(2, 16), (3, 72)])
def test_vision_rope(dev, lib, heads, hd):
    rng = seeded("vision-rope", heads, hd)
    rows = 24
    stride = 3 * heads * hd
    qkv = rng.standard_normal((rows, stride)).astype(np.float32)
    pos = rng.integers(0, 40, (rows, 2)).astype(np.uint32)
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, hd // 2, 2, dtype=np.float32) / (hd // 2))).astype(np.float32)
    buf = dev.buffer(qkv)
    lib.kernel("vision_rope").dispatch_threads(
        {0: buf, 1: dev.buffer(pos), 2: dev.buffer(inv_freq), 3: np.array([(rows, heads, hd, stride)], ROPE)},
        grid=(hd // 2, heads, rows), threads=(8, 1, 4))
    got = buf.numpy(np.float32, (rows, stride))
    want = rope_reference(qkv, pos, inv_freq, heads, hd)
    # angles up to 40 rad: one f32 rounding of pos * inv_freq is 2.4e-6 rad.
    ref.assert_within(got, want, 1e-5 * np.abs(qkv).max(), "vision_rope")
    assert np.array_equal(got[:, 2 * heads * hd:], qkv[:, 2 * heads * hd:]), "v was touched"


@pytest.mark.parametrize("rows,heads,hd,threads", [(1, 2, 16, 32), (37, 2, 72, 128), (20, 1, 128, 64),
                                                  pytest.param(256, 16, 72, 256, marks=pytest.mark.slow)])
def test_vision_attention(dev, lib, rows, heads, hd, threads):
    rng = seeded("vision-attn", rows, heads, hd)
    stride, out_stride = 3 * heads * hd + 4, heads * hd + 8
    qkv = (rng.standard_normal((rows, stride)) * 1.5).astype(np.float32)
    obuf = dev.buffer(np.full((rows, out_stride), np.nan, np.float32))
    sgs = threads // 32
    lib.kernel("vision_attention").dispatch(
        {0: dev.buffer(qkv), 1: obuf, 2: np.array([(rows, heads, hd, stride, out_stride, hd ** -0.5)], ATTN)},
        threadgroups=(-(-rows // sgs), heads), threads=(threads,))
    got = obuf.numpy(np.float32, (rows, out_stride))
    x = qkv.astype(np.float64)
    for h in range(heads):
        q = x[:, h * hd:(h + 1) * hd]
        k = x[:, (heads + h) * hd:(heads + h + 1) * hd]
        v = x[:, (2 * heads + h) * hd:(2 * heads + h + 1) * hd]
        s = q @ k.T * hd ** -0.5
        p = np.exp(s - s.max(1, keepdims=True))
        want = (p / p.sum(1, keepdims=True)) @ v
        ref.assert_within(got[:, h * hd:(h + 1) * hd], want, 2e-5 * np.abs(v).max(), f"vision_attention head {h}")
    ref.assert_untouched(got[:, heads * hd:], "out row padding")
