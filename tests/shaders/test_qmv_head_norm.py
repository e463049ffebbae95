"""shaders/qmv_head_norm.metal: DeltaNet's out_proj in decode and verify steps with the gated
output norm's per-head factor folded into its input load.

y[r] = W (g[r] * f[r]), f[r][h] = rsqrt(sum of head h's MQ_DELTA_HEAD_PARTIALS partials / D + eps)
for each head of D inputs. References are float64 numpy from that definition; weights are
mlx-quantized as in test_quant.py. Outputs start as NaN with a guard row and stride padding;
out sizes straddle the kernels' row edges; g rows and partial rows are strided with NaN padding
(a wrong stride reads NaN). Every R variant runs, verify rows equal the one-row kernel bit for
bit, and so does prefill's order (delta_norm_history's factor in place, then qmv_rows): the
fold changes no bit.
"""

import numpy as np
import pytest

from ..support import reference as ref
from ..support.require import require
from .deltanet_reference import D, HEAD_PARTIALS, channels, head_partials_ref
from .quant_reference import (
    FORMATS, QMV_DEEP_R, QMV_MAX_ROWS, QMV_R, QMV_SIMDGROUPS, QMV_SMALL_ROWS, QMV_THREADS, activations, cdiv,
    matmul_ref, seeded, tol_f32_dot)
from .test_deltanet import NORM_EPS, padded, run_norm_history
from .test_quant import Weights, nan_buffer, run_qmv_rows

EPS = NORM_EPS  # prefill_order runs delta_norm_history with it


@pytest.fixture(scope="module")
def lib(shaders):
    require("mlx.core")
    return shaders("deltanet.metal", "qmv_head_norm.metal", "quant.metal")


class HeadRows:
    """g [rows][n_v * D] and the scan's partials [rows][n_v][HEAD_PARTIALS] as strided device
    buffers with NaN padding, and u = g * f in float64."""

    def __init__(self, dev, g, partials):
        self.rows, self.n_v, _ = partials.shape
        self.in_dim = self.n_v * D
        self.g, self.partials = g, partials
        self.x_stride, self.ss_stride = self.in_dim + 4, self.n_v * HEAD_PARTIALS + 8
        f = 1.0 / np.sqrt(partials.astype(np.float64).sum(-1) / D + EPS)  # [rows][n_v]
        self.u = (g.astype(np.float64).reshape(self.rows, self.n_v, D) * f[..., None]).reshape(self.rows, -1)
        self.g_buf = dev.buffer(padded(g, self.x_stride))
        self.ss_buf = dev.buffer(padded(partials.reshape(self.rows, -1), self.ss_stride))

    @classmethod
    def random(cls, dev, rng, rows, n_v):
        """Sums of y^2 of heads of different sizes, as the scan leaves them."""
        y = rng.standard_normal((rows, n_v, D)) * rng.uniform(0.05, 3.0, (rows, n_v, 1))
        return cls(dev, activations(rng, rows, n_v * D), head_partials_ref(y).astype(np.float32))

    def row(self, dev, i):
        return HeadRows(dev, self.g[i:i + 1], self.partials[i:i + 1])


def head_norm_params(inp, out_dim, y_stride) -> np.ndarray:
    """struct QmvHeadNormParams { uint in_dim, out_dim, rows, x_stride, y_stride, ss_stride; float eps; }"""
    words = [inp.in_dim, out_dim, inp.rows, inp.x_stride, y_stride, inp.ss_stride]
    return np.array(words + [int(np.float32(EPS).view(np.uint32))], dtype=np.uint32)


def run_head_norm(dev, lib, wt, inp, r=4, y_pad=3):
    """qmv_head_norm_r<r> (one row), qmv_head_norm_rows_r<r> or (past 8 rows) qmv_head_norm_deep;
    y [rows][out_dim] after checking its guard row and stride padding."""
    out_dim = wt.value.shape[0]
    stride = out_dim + y_pad
    y = nan_buffer(dev, inp.rows + 1, stride)
    if inp.rows > QMV_SMALL_ROWS:
        name, r = f"qmv_head_norm_deep_r{QMV_DEEP_R}_{wt.fmt}", QMV_DEEP_R
    else:
        name = ("qmv_head_norm" if inp.rows == 1 else "qmv_head_norm_rows") + f"_r{r}_" + wt.fmt
    b = wt.buffers(dev)
    lib.kernel(name).dispatch({0: b[0], 1: b[1], 2: b[2], 3: inp.g_buf, 4: inp.ss_buf, 5: y,
                               6: head_norm_params(inp, out_dim, stride)},
                              threadgroups=(cdiv(out_dim, QMV_SIMDGROUPS * r),), threads=(QMV_THREADS,))
    a = y.numpy(np.float32, (inp.rows + 1, stride))
    ref.assert_untouched(a[inp.rows:], f"{name}: y past the last row")
    ref.assert_untouched(a[:inp.rows, out_dim:], f"{name}: y stride padding")
    return a[:inp.rows, :out_dim]


CASES = [  # (format, rows, value heads, out_dim, R)
    ("b4_g64", 1, 3, 37, 2),
    ("b8_g32", 3, 2, 9, 4),
    ("b3_g128", 8, 5, 33, 8),
    ("b6_g64_sf32", 2, 1, 7, 2),
    ("mxfp4", 1, 4, 31, 8),
    ("nvfp4", 5, 2, 17, 4),
    ("mxfp8", 8, 1, 1, 8),
    ("bf16", 4, 3, 64, 2),
    ("f16", 1, 1, 40, 4),
    ("f32", 7, 2, 29, 8),
    ("b5_g64", 6, 6, 20, 4),
]


@pytest.mark.parametrize("fmt,rows,n_v,out_dim,r", CASES,
                         ids=[f"{f}-{n}x{h}h-{o}-r{r}" for f, n, h, o, r in CASES])
def test_qmv_head_norm(dev, lib, fmt, rows, n_v, out_dim, r):
    rng = seeded("qmv_head_norm", fmt, rows, n_v, out_dim)
    wt = Weights.make(rng, fmt, out_dim, n_v * D)
    inp = HeadRows.random(dev, rng, rows, n_v)
    got = run_head_norm(dev, lib, wt, inp, r=r)
    want, typical = matmul_ref(wt.value, inp.u)
    ref.assert_close(got, want, tol_f32_dot(n_v * D), f"qmv_head_norm_{fmt}", scale=typical)
    # One factor per row (a plain RMSNorm's) instead of one per head is far outside the tolerance.
    if n_v > 1:
        whole = inp.g.astype(np.float64) / np.sqrt(inp.partials.astype(np.float64).sum((1, 2)) / inp.in_dim + EPS)[:, None]
        assert ref.rel_err(got, matmul_ref(wt.value, whole)[0]) > 100 * tol_f32_dot(n_v * D)


def prefill_order(dev, lib, wt, inp):
    """Prefill's two steps: delta_norm_history's factor in place (with a ring store beside it),
    then qmv_rows."""
    c = channels(1, inp.n_v)
    normed, _ = run_norm_history(dev, lib, g=inp.g.reshape(inp.rows, inp.n_v, D), partials=inp.partials,
                                 x=np.zeros((inp.rows, c), np.float32), ring=np.zeros((1, c), np.float32), position=0)
    return run_qmv_rows(dev, lib, wt, normed.reshape(inp.rows, -1), deep=inp.rows > QMV_SMALL_ROWS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_rows_and_prefill_order_match_one_row_bitwise(dev, lib, fmt):
    """qmv_head_norm_rows of every R gives each row exactly what qmv_head_norm (R = 4) gives it, as
    do the one-row kernels of every R (verify reproduces decode), and prefill's two-step order
    (factor in place, then qmv_rows) gives the same bits."""
    for n_v, rows in ((3, 5), (8, QMV_SMALL_ROWS)):
        rng = seeded("qmv_head_norm_bitwise", fmt, n_v)
        wt = Weights.make(rng, fmt, 21, n_v * D)
        inp = HeadRows.random(dev, rng, rows, n_v)
        ones = [inp.row(dev, i) for i in range(rows)]
        single = [run_head_norm(dev, lib, wt, one)[0] for one in ones]
        for r in QMV_R:
            what = f"r{r} {rows}x{n_v}h"
            assert np.array_equal(run_head_norm(dev, lib, wt, ones[0], r=r)[0].view(np.uint32),
                                  single[0].view(np.uint32)), f"{what}: one row"
            many = run_head_norm(dev, lib, wt, inp, r=r)
            for i in range(rows):
                assert np.array_equal(many[i].view(np.uint32), single[i].view(np.uint32)), f"{what}: row {i}"
        two_step = prefill_order(dev, lib, wt, inp)
        for i in range(rows):
            assert np.array_equal(two_step[i].view(np.uint32), single[i].view(np.uint32)), f"{rows}x{n_v}h: prefill row {i}"


@pytest.mark.parametrize("fmt", ["b4_g64", "b6_g32", "nvfp4", "f16"])
def test_deep_verify_rows_match_one_row_bitwise(dev, lib, fmt):
    """qmv_head_norm_deep (9..17 rows) gives each row the bits of the one-row kernels and of
    prefill's two-step order, and matches numpy."""
    for n_v, rows in ((3, QMV_MAX_ROWS), (2, QMV_SMALL_ROWS + 1)):
        rng = seeded("qmv_head_norm_deep", fmt, n_v)
        wt = Weights.make(rng, fmt, 21, n_v * D)
        inp = HeadRows.random(dev, rng, rows, n_v)
        many = run_head_norm(dev, lib, wt, inp)
        want, typical = matmul_ref(wt.value, inp.u)
        ref.assert_close(many, want, tol_f32_dot(n_v * D), f"qmv_head_norm_deep_{fmt}", scale=typical)
        two_step = prefill_order(dev, lib, wt, inp)
        for i in range(rows):
            single = run_head_norm(dev, lib, wt, inp.row(dev, i), r=(2, 8)[i % 2])[0]
            assert np.array_equal(many[i].view(np.uint32), single.view(np.uint32)), f"{rows}x{n_v}h: row {i}"
            assert np.array_equal(two_step[i].view(np.uint32), single.view(np.uint32)), f"{rows}x{n_v}h: prefill row {i}"


def test_qmv_head_norm_27b_shape(dev, lib):
    """27B's out_proj input (48 value heads, 6144 inputs), cut to a slice of its 5120 rows."""
    rng = seeded("qmv_head_norm_27b")
    wt = Weights.make(rng, "b4_g64", 72, 48 * D)
    inp = HeadRows.random(dev, rng, 1, 48)
    want, typical = matmul_ref(wt.value, inp.u)
    ref.assert_close(run_head_norm(dev, lib, wt, inp), want, tol_f32_dot(48 * D), "27B out_proj", scale=typical)
