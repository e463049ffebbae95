"""shaders/qmv_norm.metal: the norm-fused matvecs of decode and verify steps.

qmv_norm[_rows]: h = x (+ mix), u = rms(h) * norm_w, y_m = W_m u for a group of up to four
projections (separate weights, one dispatch, threadgroup ranges per member);
qmv_norm_silu[_rows]: out = silu(W_gate u) * (W_up u). Both also leave h (x_out) and u (xn)
from threadgroup 0. References are float64 numpy from the definitions; weights are mlx-quantized
as in test_quant.py. Outputs start as NaN with guard rows and stride padding (unwritten and
stray writes fail); out sizes are odd and straddle the kernels' row edges; every variant of rows
per SIMD-group R (2, 4, 8) runs, and one-row and verify-row kernels of any R agree bit for bit
(speculative decoding relies on it).
"""

import numpy as np
import pytest

from ..support import reference as ref
from ..support.require import require
from .params import header_constants
from .quant_reference import (
    FORMATS, QMV_DEEP_R, QMV_MAX_ROWS, QMV_R, QMV_SIMDGROUPS, QMV_SMALL_ROWS, QMV_THREADS, activations, cdiv,
    matmul_ref, seeded, tol_f32_dot)
from .test_quant import Weights, nan_buffer

C = header_constants("quant")
GROUP_MAX = C["MQ_QMV_GROUP_MAX"]
ADD_MIX, WRITE_H, WRITE_XN, NORM_F32 = (C[f"MQ_QMV_{n}"] for n in ("ADD_MIX", "WRITE_H", "WRITE_XN", "NORM_F32"))
EPS = 1e-6


@pytest.fixture(scope="module")
def lib(shaders):
    require("mlx.core")
    return shaders("norm.metal", "qmv_norm.metal", "quant.metal")


def norm_params(in_dim, rows, flags, out_dims, y_strides, tg_ends) -> np.ndarray:
    """struct QmvNormParams { uint in_dim, rows, x_stride, flags; float eps; uint members,
    out_dim[4], y_stride[4], tg_end[4]; } with x_stride = in_dim."""
    pad = lambda v: list(v) + [0] * (GROUP_MAX - len(v))  # noqa: E731
    words = [in_dim, rows, in_dim, flags, int(np.float32(EPS).view(np.uint32)), len(out_dims)]
    return np.array(words + pad(out_dims) + pad(y_strides) + pad(tg_ends), dtype=np.uint32)


def norm_weight(rng, n, f32):
    """Norm weights around 1 (as stored: 1 + w): (device array, float64 value)."""
    w = (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    if f32:
        return w, w.astype(np.float64)
    bits = ref.bf16_bits(w)
    return bits, ref.bf16_to_f32(bits).astype(np.float64)


def normed_ref(x, mix, wn):
    """(h, u): h = x (+ mix) as f32 adds, u = rms(h) * wn in float64."""
    h = x if mix is None else (x + mix).astype(np.float32)
    h64 = h.astype(np.float64)
    return h, h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + EPS) * wn


class Inputs:
    """x, mix (None: no residual add), the norm weight (device array, float64 value) and
    NaN-filled x_out / xn buffers (one guard row each)."""

    def __init__(self, dev, x, mix, wn, wn64, f32_norm):
        rows, in_dim = x.shape
        self.x, self.mix = x, mix
        self.h, self.u = normed_ref(x, mix, wn64)
        self.flags = (ADD_MIX | WRITE_H if mix is not None else 0) | WRITE_XN | (NORM_F32 if f32_norm else 0)
        self.bufs = {"x": dev.buffer(x), "mix": dev.buffer(x if mix is None else mix), "norm": dev.buffer(wn),
                     "x_out": nan_buffer(dev, rows + 1, in_dim), "xn": nan_buffer(dev, rows + 1, in_dim)}

    @classmethod
    def random(cls, dev, rng, rows, in_dim, add_mix, f32_norm):
        x = activations(rng, rows, in_dim)
        mix = activations(rng, rows, in_dim) if add_mix else None
        return cls(dev, x, mix, *norm_weight(rng, in_dim, f32_norm), f32_norm)

    def check_rows(self, add_mix, what):
        rows, in_dim = self.x.shape
        x_out = self.bufs["x_out"].numpy(np.float32, (rows + 1, in_dim))
        xn = self.bufs["xn"].numpy(np.float32, (rows + 1, in_dim))
        if add_mix:
            assert np.array_equal(x_out[:rows].view(np.uint32), self.h.view(np.uint32)), f"{what}: x_out != x + mix"
            ref.assert_untouched(x_out[rows:], f"{what}: x_out past the rows")
        else:
            ref.assert_untouched(x_out, f"{what}: x_out without MQ_QMV_WRITE_H")
        ref.assert_close(xn[:rows], self.u, tol_f32_dot(in_dim), f"{what}: xn")
        ref.assert_untouched(xn[rows:], f"{what}: xn past the rows")


def variant(op, rows, r):
    """The kernel for `rows` rows (one row, the small verify tier at R = r, or the deep tier at
    its own R), and its R."""
    if rows > QMV_SMALL_ROWS:
        return f"{op}_deep_r{QMV_DEEP_R}", QMV_DEEP_R
    return (op if rows == 1 else f"{op}_rows") + f"_r{r}", r


def run_qmv_norm(dev, lib, members, inp, flags=None, y_pad=3, r=4):
    """qmv_norm_r<r> (one row), qmv_norm_rows_r<r> or (past 8 rows) qmv_norm_deep over `members`
    (Weights of one format); returns each member's y [rows][out_dim] after checking its guard row
    and stride padding."""
    rows, in_dim = inp.x.shape
    kernel, r = variant("qmv_norm", rows, r)
    outs = [m.value.shape[0] for m in members]
    strides = [o + y_pad for o in outs]
    ends = list(np.cumsum([cdiv(o, QMV_SIMDGROUPS * r) for o in outs]))
    ys = [nan_buffer(dev, rows + 1, s) for s in strides]
    args = {}
    for m in range(GROUP_MAX):
        src = min(m, len(members) - 1)  # slots past the members repeat the last
        b = members[src].buffers(dev)
        args.update({m: b[0], 4 + m: b[1], 8 + m: b[2], 17 + m: ys[src]})
    args.update({12: inp.bufs["x"], 13: inp.bufs["mix"], 14: inp.bufs["norm"], 15: inp.bufs["x_out"],
                 16: inp.bufs["xn"],
                 21: norm_params(in_dim, rows, inp.flags if flags is None else flags, outs, strides, ends)})
    name = f"{kernel}_{members[0].fmt}"
    lib.kernel(name).dispatch(args, threadgroups=(int(ends[-1]),), threads=(QMV_THREADS,))
    got = []
    for y, o, s in zip(ys, outs, strides):
        a = y.numpy(np.float32, (rows + 1, s))
        ref.assert_untouched(a[rows:], f"{name}: y past the last row")
        ref.assert_untouched(a[:rows, o:], f"{name}: y stride padding")
        got.append(a[:rows, :o])
    return got


GROUP_CASES = [  # (format, rows, in_dim, out dims of the members, R)
    ("b4_g64", 1, 256, (37, 5, 1, 3), 2),
    ("b8_g32", 3, 384, (9, 16), 4),
    ("b3_g128", 8, 1280, (33,), 8),
    ("b6_g64_sf32", 2, 128, (7, 1, 8), 2),
    ("mxfp4", 1, 640, (31, 2, 2, 17), 8),
    ("nvfp4", 5, 256, (8, 9), 4),
    ("mxfp8", 8, 128, (1, 1, 1, 1), 8),
    ("bf16", 4, 384, (13, 64), 2),
    ("f16", 1, 128, (40,), 4),
    ("f32", 7, 256, (3, 29, 5), 8),
    ("b2_g32", 6, 512, (12, 4, 20, 1), 4),
    ("b5_g64", 1, 1024, (25, 7), 2),
]


@pytest.mark.parametrize("add_mix", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("fmt,rows,in_dim,outs,r", GROUP_CASES,
                         ids=[f"{f}-{n}x{i}-{'_'.join(map(str, o))}-r{r}" for f, n, i, o, r in GROUP_CASES])
def test_qmv_norm_group(dev, lib, fmt, rows, in_dim, outs, r, add_mix):
    rng = seeded("qmv_norm", fmt, rows, in_dim, outs, add_mix)
    members = [Weights.make(rng, fmt, o, in_dim) for o in outs]
    inp = Inputs.random(dev, rng, rows, in_dim, add_mix, f32_norm=len(outs) % 2 == 1)
    got = run_qmv_norm(dev, lib, members, inp, r=r)
    for i, (m, y) in enumerate(zip(members, got)):
        want, typical = matmul_ref(m.value, inp.u)
        ref.assert_close(y, want, tol_f32_dot(in_dim), f"qmv_norm_{fmt} member {i}", scale=typical)
    inp.check_rows(add_mix, f"qmv_norm_{fmt}")


def test_qmv_norm_writes_nothing_else_when_asked(dev, lib):
    """Without the write flags (the later dispatches of a mixed-format group) x_out and xn stay
    untouched; y is unchanged."""
    rng = seeded("qmv_norm_quiet")
    members = [Weights.make(rng, "b4_g32", 19, 256)]
    inp = Inputs.random(dev, rng, 2, 256, True, f32_norm=False)
    y = run_qmv_norm(dev, lib, members, inp, flags=ADD_MIX)[0]
    want, typical = matmul_ref(members[0].value, inp.u)
    ref.assert_close(y, want, tol_f32_dot(256), "qmv_norm quiet", scale=typical)
    ref.assert_untouched(inp.bufs["x_out"].numpy(np.float32, (3, 256)), "x_out")
    ref.assert_untouched(inp.bufs["xn"].numpy(np.float32, (3, 256)), "xn")


def run_qmv_norm_silu(dev, lib, gate, up, inp, y_pad=5, r=4):
    rows, in_dim = inp.x.shape
    kernel, r = variant("qmv_norm_silu", rows, r)
    out_dim = gate.value.shape[0]
    stride = out_dim + y_pad
    y = nan_buffer(dev, rows + 1, stride)
    g, u = gate.buffers(dev), up.buffers(dev)
    groups = cdiv(out_dim, QMV_SIMDGROUPS * r // 2)  # r / 2 gate and r / 2 up rows per SIMD-group
    name = f"{kernel}_{gate.fmt}"
    lib.kernel(name).dispatch(
        {0: g[0], 1: g[1], 2: g[2], 3: u[0], 4: u[1], 5: u[2], 6: inp.bufs["x"], 7: inp.bufs["mix"],
         8: inp.bufs["norm"], 9: inp.bufs["x_out"], 10: inp.bufs["xn"], 11: y,
         12: norm_params(in_dim, rows, inp.flags, [out_dim], [stride], [groups])},
        threadgroups=(groups,), threads=(QMV_THREADS,))
    a = y.numpy(np.float32, (rows + 1, stride))
    ref.assert_untouched(a[rows:], f"{name}: out past the last row")
    ref.assert_untouched(a[:rows, out_dim:], f"{name}: out stride padding")
    return a[:rows, :out_dim]


SILU_CASES = [("b4_g64", 1, 256, 37, 8), ("b8_g128", 8, 384, 9, 2), ("nvfp4", 3, 128, 1, 4),
              ("bf16", 2, 640, 64, 8), ("b3_g32", 1, 512, 129, 2), ("mxfp8", 5, 256, 3, 8), ("f32", 7, 128, 20, 4),
              ("b5_g64_sf32", 4, 1280, 6, 2)]


@pytest.mark.parametrize("fmt,rows,in_dim,out_dim,r", SILU_CASES,
                         ids=[f"{f}-{n}x{i}-{o}-r{r}" for f, n, i, o, r in SILU_CASES])
def test_qmv_norm_silu(dev, lib, fmt, rows, in_dim, out_dim, r):
    rng = seeded("qmv_norm_silu", fmt, rows, in_dim, out_dim)
    gate, up = Weights.make(rng, fmt, out_dim, in_dim), Weights.make(rng, fmt, out_dim, in_dim)
    inp = Inputs.random(dev, rng, rows, in_dim, True, f32_norm=rows % 2 == 0)
    got = run_qmv_norm_silu(dev, lib, gate, up, inp, r=r)
    g, g_typ = matmul_ref(gate.value, inp.u)
    u, u_typ = matmul_ref(up.value, inp.u)
    want = g / (1.0 + np.exp(-g)) * u
    # Each factor carries a dot product's rounding; silu' <= 1.1 bounds how silu passes its share on.
    ref.assert_close(got, want, 2.2 * tol_f32_dot(in_dim), f"qmv_norm_silu_{fmt}", scale=g_typ * u_typ)
    inp.check_rows(True, f"qmv_norm_silu_{fmt}")


# (in_dim, rows of the verify step): short rows (a lane's steps fewer than its blocks in flight)
# and a row with a partial last step; the members' and gate's row counts straddle every
# variant's threadgroup.
BITWISE_SHAPES = [(1024, QMV_SMALL_ROWS), (384, 2), (2176, 5)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_rows_match_one_row_bitwise(dev, lib, fmt):
    """qmv_norm_rows / qmv_norm_silu_rows of every R variant give each row exactly what the
    one-row kernels (R = 4) give it, and so do the one-row kernels of every R (a speculative
    verify step reproduces greedy decode bit for bit whichever variants the engine picked)."""
    for in_dim, rows in BITWISE_SHAPES:
        rng = seeded("qmv_norm_bitwise", fmt, in_dim)
        members = [Weights.make(rng, fmt, o, in_dim) for o in (21, 3)]
        gate, up = Weights.make(rng, fmt, 17, in_dim), Weights.make(rng, fmt, 17, in_dim)
        wn, wn64 = norm_weight(rng, in_dim, False)
        x, mix = activations(rng, rows, in_dim), activations(rng, rows, in_dim)
        ones = [Inputs(dev, x[i:i + 1], mix[i:i + 1], wn, wn64, False) for i in range(rows)]
        single = [run_qmv_norm(dev, lib, members, one) for one in ones]
        single_silu = [run_qmv_norm_silu(dev, lib, gate, up, one) for one in ones]
        single_xn = [one.bufs["xn"].numpy(np.float32, (2, in_dim))[0] for one in ones]
        for r in QMV_R:
            what = f"r{r} {rows}x{in_dim}"
            one = Inputs(dev, x[:1], mix[:1], wn, wn64, False)
            for a, b in zip(run_qmv_norm(dev, lib, members, one, r=r), single[0]):
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{what}: qmv_norm one row differs"
            silu = run_qmv_norm_silu(dev, lib, gate, up, one, r=r)
            assert np.array_equal(silu.view(np.uint32), single_silu[0].view(np.uint32)), f"{what}: silu one row"
            inp = Inputs(dev, x, mix, wn, wn64, False)
            many = run_qmv_norm(dev, lib, members, inp, r=r)
            many_silu = run_qmv_norm_silu(dev, lib, gate, up, inp, r=r)
            many_xn = inp.bufs["xn"].numpy(np.float32, (rows + 1, in_dim))[:rows]
            for i in range(rows):
                for a, b in zip(single[i], many):
                    assert np.array_equal(a[0].view(np.uint32), b[i].view(np.uint32)), f"{what} row {i}: qmv_norm"
                assert np.array_equal(single_xn[i].view(np.uint32), many_xn[i].view(np.uint32)), f"{what} row {i}: xn"
                assert np.array_equal(single_silu[i][0].view(np.uint32), many_silu[i].view(np.uint32)), \
                    f"{what} row {i}: silu"


@pytest.mark.parametrize("fmt", ["b4_g64", "b8_g128", "mxfp4", "bf16"])
def test_deep_verify_rows_match_one_row_bitwise(dev, lib, fmt):
    """The deep tier (qmv_norm_deep, qmv_norm_silu_deep: 9..17 rows) gives each row the bits of the
    one-row kernels (a DFlash verify step of 16 drafts reproduces greedy decode) and matches numpy."""
    for in_dim, rows in ((1024, QMV_MAX_ROWS), (2176, QMV_SMALL_ROWS + 1)):
        rng = seeded("qmv_norm_deep", fmt, in_dim)
        members = [Weights.make(rng, fmt, o, in_dim) for o in (21, 3)]
        gate, up = Weights.make(rng, fmt, 17, in_dim), Weights.make(rng, fmt, 17, in_dim)
        wn, wn64 = norm_weight(rng, in_dim, False)
        x, mix = activations(rng, rows, in_dim), activations(rng, rows, in_dim)
        inp = Inputs(dev, x, mix, wn, wn64, False)
        many = run_qmv_norm(dev, lib, members, inp)
        inp.check_rows(True, f"qmv_norm_deep_{fmt}")
        for m, y in zip(members, many):
            want, typical = matmul_ref(m.value, inp.u)
            ref.assert_close(y, want, tol_f32_dot(in_dim), f"qmv_norm_deep_{fmt}", scale=typical)
        many_silu = run_qmv_norm_silu(dev, lib, gate, up, inp)
        for i in range(rows):
            one = Inputs(dev, x[i:i + 1], mix[i:i + 1], wn, wn64, False)
            r = (2, 8)[i % 2]
            for a, b in zip(run_qmv_norm(dev, lib, members, one, r=r), many):
                assert np.array_equal(a[0].view(np.uint32), b[i].view(np.uint32)), f"{rows} rows, row {i}: qmv_norm"
            silu = run_qmv_norm_silu(dev, lib, gate, up, one, r=r)
            assert np.array_equal(silu[0].view(np.uint32), many_silu[i].view(np.uint32)), f"{rows} rows, row {i}: silu"


def test_qmv_norm_27b_input_group(dev, lib):
    """The 27B DeltaNet input group's shape (hidden 5120; qkv 10240, z 6144, b 48, a 48), each
    member cut to a slice of its rows (the full matrices are 270 MB of test data)."""
    rng = seeded("qmv_norm_27b")
    in_dim = 5120
    members = [Weights.make(rng, "b4_g64", o, in_dim) for o in (72, 40, 48, 48)]
    inp = Inputs.random(dev, rng, 1, in_dim, True, f32_norm=False)
    for i, (m, y) in enumerate(zip(members, run_qmv_norm(dev, lib, members, inp))):
        want, typical = matmul_ref(m.value, inp.u)
        ref.assert_close(y, want, tol_f32_dot(in_dim), f"27B member {i}", scale=typical)
    inp.check_rows(True, "27B")


def test_qmv_norm_has_no_races_or_stray_accesses():
    """Under the CPU runtime's race and bounds checks: threadgroup 0 writes x_out and xn while
    every threadgroup reads x and mix (distinct buffers), members write their own y."""
    from metalqwen import gpu

    from .conftest import compiled_kernels

    dev = gpu.Device("cpu", checks=("races", "bounds"))
    lib = compiled_kernels(dev, "norm.metal", "qmv_norm.metal", "quant.metal")
    rng = seeded("qmv_norm_checks")
    members = [Weights.make(rng, "b4_g32", o, 256) for o in (9, 1, 17)]
    inp = Inputs.random(dev, rng, 3, 256, True, f32_norm=False)
    for r in QMV_R:
        run_qmv_norm(dev, lib, members, inp, r=r)
        run_qmv_norm_silu(dev, lib, *members[0:1] * 2, inp, r=r)
    deep = Inputs.random(dev, rng, QMV_SMALL_ROWS + 2, 256, True, f32_norm=True)
    run_qmv_norm(dev, lib, members, deep)
    run_qmv_norm_silu(dev, lib, *members[0:1] * 2, deep)
