"""shaders/quant.metal: projections and the embedding gather in every weight format.

Every kernel is compared with float64 numpy (dequantize, then matmul) for all 30 formats
(affine 2/3/4/5/6/8-bit x groups 32/64/128 with bf16 scales, and at group 64 with f32 scales;
mxfp4, nvfp4, mxfp8, bf16, f16, f32), on weights
quantized by mlx's own ``mx.quantize``; the numpy decoders are first shown to reproduce
``mx.dequantize`` bit for bit, so the kernels read mlx's packing. Outputs start as NaN and sit
between NaN guard rows/columns (so unwritten and stray writes both fail); sizes straddle the
SIMD width and the kernels' row/tile edges; the matvecs run in every variant of rows per
SIMD-group R (2, 4, 8) and in the deep verify tier (up to 17 rows at R = 4), which must all give
the same bits; each 27B projection runs once through the decode
matvec on a slice of its rows, dispatched at a buffer offset. Tolerances: `tol_f32_dot`
(f32 accumulation, see quant_reference.py); the embedding gather is exact.
"""

import numpy as np
import pytest

from ..support import reference as ref
from ..support.require import require
from .quant_reference import (
    EMBED_THREADS, FORMATS, QMM_THREADS, QMM_TILE_OUT, QMM_TILE_ROWS, QMV_DEEP_R, QMV_MAX_ROWS, QMV_R,
    QMV_SIMDGROUPS, QMV_SMALL_ROWS, QMV_THREADS, QUANT_BLOCK, activations, affine_format, cdiv, embed_params,
    format_weights, matmul_params, matmul_ref, random_quantized, seeded, tol_f32_dot)


@pytest.fixture(scope="module")
def lib(shaders):
    require("mlx.core")
    return shaders("quant.metal")


class Weights:
    """One test matrix in format ``fmt``: device words/scales/biases and its float32 value."""

    def __init__(self, fmt, words, scales, biases, value):
        self.fmt, self.words, self.scales, self.biases, self.value = fmt, words, scales, biases, value

    @classmethod
    def make(cls, rng, fmt, out_dim, in_dim):
        return cls(fmt, *format_weights(rng, fmt, out_dim, in_dim))

    def buffers(self, dev, first_row=0):
        """{0: w, 1: scales, 2: biases} at row ``first_row``; absent scales/biases bind the weights."""
        def at(a):
            return (dev.buffer(a), first_row * a.shape[1] * a.itemsize)
        w = at(self.words)
        return {0: w, 1: at(self.scales) if self.scales is not None else w,
                2: at(self.biases) if self.biases is not None else w}


def weights_from_codes(bits, group, words, sb, bb):
    return Weights(f"b{bits}_g{group}", words, sb, bb, ref.dequantize(words, sb, bb, group, bits))


def nan_buffer(dev, *shape):
    return dev.buffer(np.full(shape, np.nan, dtype=np.float32))


def run_qmv(dev, lib, wt, x, r=4):
    """qmv_r<r> on one x row; y has a NaN guard of a threadgroup's rows after out_dim elements."""
    out_dim, in_dim = wt.value.shape
    per_tg = QMV_SIMDGROUPS * r
    y = nan_buffer(dev, out_dim + per_tg)
    lib.kernel(f"qmv_r{r}_{wt.fmt}").dispatch(
        {**wt.buffers(dev), 3: dev.buffer(x.reshape(-1)), 4: y, 5: matmul_params(in_dim, out_dim)},
        threadgroups=(cdiv(out_dim, per_tg),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (out_dim + per_tg,))
    ref.assert_untouched(got[out_dim:], "y past out_dim")
    return got[:out_dim]


def check_matmul(got, wt, x, what):
    want, typical = matmul_ref(wt.value, x)
    ref.assert_close(got, want.reshape(got.shape), tol_f32_dot(x.shape[-1]), what, scale=typical)


# ---------------------------------------------------------------------------
# The numpy decoders are mlx's: bit for bit against mx.dequantize


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in ("bf16", "f16", "f32") and not f.endswith("_sf32")])
def test_decoders_reproduce_mx_dequantize(fmt):
    mx = require("mlx.core")
    rng = seeded("decode", fmt)
    words, scales, biases, value = format_weights(rng, fmt, 5, 384)
    aff = affine_format(fmt)
    if aff is None:  # exact products: our value is mlx's
        bits, group = ref.FP_MODES[fmt]
        theirs = mx.dequantize(mx.array(words), mx.array(scales), group_size=group, bits=bits, mode=fmt,
                               dtype=mx.float32)
        assert np.array_equal(value, np.array(theirs))
        return
    bits, group = aff
    s = mx.array(ref.bf16_to_f32(scales))
    b = mx.array(ref.bf16_to_f32(biases))
    theirs = np.array(mx.dequantize(mx.array(words), s, b, group_size=group, bits=bits))
    # mlx rounds scale * q and then the sum; the codes are what must agree.
    codes = ref.unpack_bits(words, bits).astype(np.float32)
    ours = codes * np.repeat(np.array(s), group, 1) + np.repeat(np.array(b), group, 1)
    assert np.array_equal(ours, theirs)
    assert np.abs(value - theirs).max() <= np.abs(theirs).max() * 2.0**-23  # value: rounded once (fma)


def test_bit_stream_across_words():
    # 3-bit codes: code 10 occupies stream bits 30..32, straddling words 0 and 1.
    words = np.array([[0b10 << 30, 0b1, 0]], np.uint32)
    assert ref.unpack_bits(words, 3)[0, 10] == 0b110 and ref.unpack_bits(words, 3)[0, 11] == 0


# ---------------------------------------------------------------------------
# Decode matvec


QMV_SHAPES = [  # (out_dim, in_dim): in_dim a multiple of 128 so every group size applies;
    # 1024 (0.8B hidden) is exactly one block per lane at 4 bits, 3584 (0.8B intermediate)
    # leaves half the lanes a block short on the last step.
    (1, 128), (7, 384), (8, 1280), (9, 128), (31, 3584), (32, 384),
    (33, 1280), (127, 1024), (128, 384), (129, 640),
]


# Every format on a few shapes, the common 4-bit formats on all of them; the R variants in turn.
SHAPE_CASES = ([(fmt, shape) for fmt in FORMATS for shape in QMV_SHAPES[::3]]
               + [(fmt, shape) for fmt in ("b4_g64", "mxfp4") for shape in QMV_SHAPES if shape not in QMV_SHAPES[::3]])
SHAPE_CASES = [(fmt, shape, QMV_R[i % len(QMV_R)]) for i, (fmt, shape) in enumerate(SHAPE_CASES)]


@pytest.mark.parametrize("fmt,shape,r", SHAPE_CASES, ids=[f"{f}-{o}x{i}-r{r}" for f, (o, i), r in SHAPE_CASES])
def test_qmv(dev, lib, fmt, shape, r):
    out_dim, in_dim = shape
    rng = seeded("qmv", fmt, out_dim, in_dim)
    wt = Weights.make(rng, fmt, out_dim, in_dim)
    x = activations(rng, 1, in_dim)
    check_matmul(run_qmv(dev, lib, wt, x, r), wt, x, f"qmv_r{r}_{fmt} {out_dim}x{in_dim}")


@pytest.mark.parametrize("fmt", ["b3_g32", "b8_g128", "nvfp4", "bf16"])
def test_qmv_smallest_row(dev, lib, fmt):
    """in_dim = one block or group: fewer blocks than lanes (most lanes contribute nothing)."""
    in_dim = max(QUANT_BLOCK, affine_format(fmt)[1] if affine_format(fmt) else 0)
    rng = seeded("qmv-small", fmt)
    wt = Weights.make(rng, fmt, 9, in_dim)
    x = activations(rng, 1, in_dim)
    for r in QMV_R:
        check_matmul(run_qmv(dev, lib, wt, x, r), wt, x, f"qmv_r{r} one group")


# The 27B projections (docs/design.md, "Real sizes"): (in_dim, out_dim of the whole matrix).
# A slice of `rows_stored` weight rows is made; `rows_run` rows ending at the slice's
# end are computed through buffer offsets (so the row tail sits at the buffer's end).
BIG = [
    pytest.param(5120, 17408, 640, 300, id="gate_up_5120x17408"),
    pytest.param(17408, 5120, 400, 200, id="down_17408x5120"),
    pytest.param(5120, 10240, 520, 260, id="qkv_5120x10240"),
    pytest.param(6144, 5120, 460, 230, id="o_out_6144x5120"),
    pytest.param(5120, 248320, 16384, 300, id="head_5120x248320_slice", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("in_dim,full_out,rows_stored,rows_run", BIG)
def test_qmv_27b(dev, lib, in_dim, full_out, rows_stored, rows_run):
    bits, group = 4, 64  # mlx-community's 4-bit checkpoints
    rng = seeded("qmv27b", in_dim, full_out)
    wt = weights_from_codes(bits, group, *random_quantized(rng, rows_stored, in_dim, bits, group))
    x = activations(rng, 1, in_dim)
    first = rows_stored - rows_run
    r = 8  # the engine's pick for these matrices on chips of up to 80 cores (plan_kernels)
    per_tg = QMV_SIMDGROUPS * r
    y = nan_buffer(dev, rows_stored + per_tg)
    lib.kernel(f"qmv_r{r}_{wt.fmt}").dispatch(
        {**wt.buffers(dev, first), 3: dev.buffer(x.reshape(-1)), 4: (y, first * 4), 5: matmul_params(in_dim, rows_run)},
        threadgroups=(cdiv(rows_run, per_tg),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (rows_stored + per_tg,))
    ref.assert_untouched(got[:first], "y before the slice")
    ref.assert_untouched(got[rows_stored:], "y past the slice")
    tail = Weights(wt.fmt, None, None, None, wt.value[first:])
    check_matmul(got[first:rows_stored], tail, x, f"qmv {in_dim}->{full_out} rows {first}..{rows_stored}")


@pytest.mark.parametrize("fmt", ["b8_g64", "b3_g64", "nvfp4", "bf16"])
def test_qmv_27b_widest_row(dev, lib, fmt):
    """The widest input (down_proj, 17408) in an 8-bit, a word-straddling, an fp and a float format."""
    rng = seeded("qmv27b-wide", fmt)
    wt = Weights.make(rng, fmt, 40, 17408)
    x = activations(rng, 1, 17408)
    check_matmul(run_qmv(dev, lib, wt, x, 2), wt, x, f"qmv_r2_{fmt} 17408")


# ---------------------------------------------------------------------------
# Verify matvec


def run_qmv_rows(dev, lib, wt, x, x_stride=None, y_stride=None, r=4, deep=False):
    """qmv_rows_r<r> (or, deep, qmv_deep_r<QMV_DEEP_R>) over the rows of x; returns y
    [rows][y_stride] plus a NaN guard row."""
    rows, in_dim = x.shape
    r = QMV_DEEP_R if deep else r
    out_dim = wt.value.shape[0]
    x_stride = in_dim if x_stride is None else x_stride
    y_stride = out_dim if y_stride is None else y_stride
    xs = np.full((rows, x_stride), np.nan, np.float32)  # stride padding is NaN: must be ignored
    xs[:, :in_dim] = x
    y = nan_buffer(dev, rows + 1, y_stride)
    lib.kernel(f"qmv_{'deep' if deep else 'rows'}_r{r}_{wt.fmt}").dispatch(
        {**wt.buffers(dev), 3: dev.buffer(xs), 4: y, 5: matmul_params(in_dim, out_dim, rows, x_stride, y_stride)},
        threadgroups=(cdiv(out_dim, QMV_SIMDGROUPS * r),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (rows + 1, y_stride))
    ref.assert_untouched(got[rows:], "y past the last row")
    ref.assert_untouched(got[:rows, out_dim:], "y stride padding")
    return got[:rows, :out_dim]


QMV_ROWS_SHAPES = [(1, 33, 384), (2, 7, 128), (3, 129, 640), (4, 8, 1280),
                   (5, 31, 256), (6, 1, 384), (7, 32, 128), (8, 127, 1280)]
ROWS_CASES = [(fmt, QMV_ROWS_SHAPES[i % len(QMV_ROWS_SHAPES)], QMV_R[i % len(QMV_R)]) for i, fmt in enumerate(FORMATS)] + \
             [(fmt, QMV_ROWS_SHAPES[(i + 4) % len(QMV_ROWS_SHAPES)], QMV_R[(i + 1) % len(QMV_R)])
              for i, fmt in enumerate(FORMATS)]


@pytest.mark.parametrize("fmt,shape,r", ROWS_CASES, ids=[f"{f}-{n}x{o}x{i}-r{r}" for f, (n, o, i), r in ROWS_CASES])
def test_qmv_rows(dev, lib, fmt, shape, r):
    rows, out_dim, in_dim = shape
    rng = seeded("qmv_rows", fmt, rows, out_dim, in_dim)
    wt = Weights.make(rng, fmt, out_dim, in_dim)
    x = activations(rng, rows, in_dim)
    check_matmul(run_qmv_rows(dev, lib, wt, x, r=r), wt, x, f"qmv_rows_r{r}_{fmt} {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("fmt", ["b4_g64", "b8_g32", "b5_g128", "mxfp4", "nvfp4", "mxfp8", "bf16", "f32"])
def test_qmv_rows_match_decode_bitwise(dev, lib, fmt):
    """Verify rows use decode's exact per-row reduction order, so a speculative verify
    step reproduces greedy decode bit for bit (same device, same compiler settings).
    Also exercises row strides wider than the data (NaN-filled gaps)."""
    rows, out_dim, in_dim = QMV_SMALL_ROWS, 37, 1280
    rng = seeded("qmv_rows_bitwise", fmt)
    wt = Weights.make(rng, fmt, out_dim, in_dim)
    x = activations(rng, rows, in_dim)
    got = run_qmv_rows(dev, lib, wt, x, x_stride=in_dim + 12, y_stride=out_dim + 5)
    for r in range(rows):
        single = run_qmv(dev, lib, wt, x[r])
        assert np.array_equal(got[r].view(np.uint32), single.view(np.uint32)), f"row {r} differs from qmv"


@pytest.mark.parametrize("fmt", ["b4_g64", "b3_g32", "b6_g64_sf32", "mxfp4", "nvfp4", "bf16"])
def test_deep_verify_rows_match_decode_bitwise(dev, lib, fmt):
    """The deep tier (qmv_deep: 9..17 rows, a DFlash block of 16 drafts + 1) gives every row the
    bits of qmv_r2 and qmv_r8 on that row, on a short row and one with a partial last lane-step,
    the out edge inside a threadgroup; its values match numpy."""
    for out_dim, in_dim in ((13, 1024), (19, 2176)):
        rng = seeded("qmv_deep", fmt, out_dim, in_dim)
        wt = Weights.make(rng, fmt, out_dim, in_dim)
        x = activations(rng, QMV_MAX_ROWS, in_dim)
        got = run_qmv_rows(dev, lib, wt, x, x_stride=in_dim + 4, y_stride=out_dim + 3, deep=True)
        check_matmul(got, wt, x, f"qmv_deep_{fmt} {QMV_MAX_ROWS}x{out_dim}x{in_dim}")
        nine = run_qmv_rows(dev, lib, wt, x[:QMV_SMALL_ROWS + 1], deep=True)  # the tier's fewest rows
        for i in range(QMV_MAX_ROWS):
            single = run_qmv(dev, lib, wt, x[i], r=(2, 8)[i % 2])
            assert np.array_equal(got[i].view(np.uint32), single.view(np.uint32)), f"qmv_deep row {i} {out_dim}"
            if i <= QMV_SMALL_ROWS:
                assert np.array_equal(nine[i].view(np.uint32), single.view(np.uint32)), f"9 deep rows: row {i}"


# Short rows (a lane has fewer steps than the blocks it keeps in flight: the lane-divergent tail
# of the walk) and a row of 68 blocks (two full lane-steps plus 4 lanes with a third); out
# sizes straddle every variant's threadgroup (4, 8, 16 rows) and stay under one.
VARIANT_SHAPES = [(33, 1024), (7, 384), (19, 2176)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_qmv_variants_agree_bitwise(dev, lib, fmt):
    """Every R variant of qmv and of qmv_rows (1..8 rows) gives each row exactly the bits of
    qmv_r4 on that row (the engine picks R per shape; speculative verify relies on the bits), and
    qmv_r4 matches numpy."""
    for out_dim, in_dim in VARIANT_SHAPES:
        rng = seeded("qmv_variants", fmt, out_dim, in_dim)
        wt = Weights.make(rng, fmt, out_dim, in_dim)
        x = activations(rng, QMV_SMALL_ROWS, in_dim)
        singles = [run_qmv(dev, lib, wt, x[i]) for i in range(QMV_SMALL_ROWS)]
        check_matmul(singles[0], wt, x[:1], f"qmv_r4_{fmt} {out_dim}x{in_dim}")
        for k, r in enumerate(QMV_R):
            one = run_qmv(dev, lib, wt, x[0], r)
            assert np.array_equal(one.view(np.uint32), singles[0].view(np.uint32)), f"qmv_r{r} {out_dim}x{in_dim}"
            for rows in (1, 2 + 3 * k, QMV_SMALL_ROWS):  # 1, then 2, 5 and 8 rows over the variants
                got = run_qmv_rows(dev, lib, wt, x[:rows], r=r)
                for i in range(rows):
                    assert np.array_equal(got[i].view(np.uint32), singles[i].view(np.uint32)), \
                        f"qmv_rows_r{r} ({rows} rows) row {i} {out_dim}x{in_dim}"


def test_qmv_has_no_races_or_stray_accesses():
    """Under the CPU runtime's race and bounds checks, every R variant on a short row and a row
    with a partial last step, the out edge inside a threadgroup."""
    from metalqwen import gpu

    from .conftest import compiled_kernels

    dev = gpu.Device("cpu", checks=("races", "bounds"))
    checked = compiled_kernels(dev, "norm.metal", "qmv_norm.metal", "quant.metal")  # test_qmv_norm.py's, compiled once
    rng = seeded("qmv_checks")
    for out_dim, in_dim in ((13, 1024), (5, 2176)):
        wt = Weights.make(rng, "b4_g64", out_dim, in_dim)
        x = activations(rng, 3, in_dim)
        for r in QMV_R:
            check_matmul(run_qmv(dev, checked, wt, x[0], r), wt, x[:1], f"qmv_r{r} checked")
            check_matmul(run_qmv_rows(dev, checked, wt, x, r=r), wt, x, f"qmv_rows_r{r} checked")
        check_matmul(run_qmv_rows(dev, checked, wt, x, deep=True), wt, x, "qmv_deep checked")


def test_qmv_rows_27b(dev, lib):
    """Eight verify rows, and a deep step's 17, at the 27B hidden size (5120 -> a slice of q_proj)."""
    bits, group, in_dim, out_dim = 4, 64, 5120, 72
    rng = seeded("qmv_rows27b")
    wt = weights_from_codes(bits, group, *random_quantized(rng, out_dim, in_dim, bits, group))
    x = activations(rng, QMV_MAX_ROWS, in_dim)
    check_matmul(run_qmv_rows(dev, lib, wt, x[:QMV_SMALL_ROWS]), wt, x[:QMV_SMALL_ROWS], "qmv_rows 8x5120")
    check_matmul(run_qmv_rows(dev, lib, wt, x, deep=True), wt, x, "qmv_deep 17x5120")


# ---------------------------------------------------------------------------
# Prefill GEMM


def run_qmm(dev, lib, wt, x, x_stride=None, y_stride=None):
    """qmm over all rows of x. X occupies exactly rows*x_stride floats (no padding rows:
    the kernel must not need them); y has a NaN guard row."""
    rows, in_dim = x.shape
    out_dim = wt.value.shape[0]
    x_stride = in_dim if x_stride is None else x_stride
    y_stride = out_dim if y_stride is None else y_stride
    xs = np.full((rows, x_stride), np.nan, np.float32)
    xs[:, :in_dim] = x
    y = nan_buffer(dev, rows + 1, y_stride)
    lib.kernel(f"qmm_{wt.fmt}").dispatch(
        {**wt.buffers(dev), 3: dev.buffer(xs), 4: y, 5: matmul_params(in_dim, out_dim, rows, x_stride, y_stride)},
        threadgroups=(cdiv(rows, QMM_TILE_ROWS), cdiv(out_dim, QMM_TILE_OUT)), threads=(QMM_THREADS,))
    got = y.numpy(np.float32, (rows + 1, y_stride))
    ref.assert_untouched(got[rows:], "y past the last row")
    ref.assert_untouched(got[:rows, out_dim:], "y stride padding")
    return got[:rows, :out_dim]


QMM_SHAPES = [  # (rows, out_dim, in_dim)
    (1, 1, 128), (7, 33, 256), (8, 64, 128), (9, 129, 384), (33, 127, 256),
    (32, 128, 256),  # whole tiles only: the direct-store path
    (40, 72, 128),  # partial tiles in both directions
    (100, 192, 128),  # several row tiles, whole column tiles
]
QMM_CASES = [(fmt, QMM_SHAPES[i % len(QMM_SHAPES)]) for i, fmt in enumerate(FORMATS)] + \
            [(fmt, QMM_SHAPES[(i + 3) % len(QMM_SHAPES)]) for i, fmt in enumerate(FORMATS)]


@pytest.mark.parametrize("fmt,shape", QMM_CASES, ids=[f"{f}-{r}x{o}x{i}" for f, (r, o, i) in QMM_CASES])
def test_qmm(dev, lib, fmt, shape):
    rows, out_dim, in_dim = shape
    rng = seeded("qmm", fmt, rows, out_dim, in_dim)
    wt = Weights.make(rng, fmt, out_dim, in_dim)
    x = activations(rng, rows, in_dim)
    check_matmul(run_qmm(dev, lib, wt, x), wt, x, f"qmm_{fmt} {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("fmt", ["b4_g32", "b6_g64", "nvfp4", "f16"])
def test_qmm_strided_and_one_block(dev, lib, fmt):
    """Row strides wider than the data (NaN gaps must be ignored / left alone), and the
    shortest K (one K-step) next to a long one."""
    rng = seeded("qmm-strided", fmt)
    aff = affine_format(fmt)
    for rows, out_dim, in_dim in [(9, 65, max(QUANT_BLOCK, aff[1] if aff else 0)), (33, 64, 640)]:
        wt = Weights.make(rng, fmt, out_dim, in_dim)
        x = activations(rng, rows, in_dim)
        got = run_qmm(dev, lib, wt, x, x_stride=in_dim + 8, y_stride=out_dim + 3)
        check_matmul(got, wt, x, f"qmm strided {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("in_dim,out_dim", [(5120, 72), pytest.param(17408, 40, marks=pytest.mark.slow)])
def test_qmm_27b(dev, lib, in_dim, out_dim):
    """Prefill at the 27B widths (hidden 5120, intermediate 17408): 33 rows (a partial row
    tile), a slice of the outputs."""
    bits, group, rows = 4, 64, 33
    rng = seeded("qmm27b", in_dim)
    wt = weights_from_codes(bits, group, *random_quantized(rng, out_dim, in_dim, bits, group))
    x = activations(rng, rows, in_dim)
    check_matmul(run_qmm(dev, lib, wt, x), wt, x, f"qmm 33x{in_dim}")


# ---------------------------------------------------------------------------
# Embedding gather


def run_embed(dev, lib, wt, ids, first, rows):
    vocab, dim = wt.value.shape
    hidden = nan_buffer(dev, rows + 1, dim)
    lib.kernel(f"embed_{wt.fmt}").dispatch(
        {**wt.buffers(dev), 3: dev.buffer(np.asarray(ids, np.uint32)), 4: hidden,
         5: embed_params(dim, vocab, first, rows)},
        threadgroups=(cdiv(dim // QUANT_BLOCK, EMBED_THREADS), rows), threads=(EMBED_THREADS,))
    got = hidden.numpy(np.float32, (rows + 1, dim))
    ref.assert_untouched(got[rows:], "hidden past the last row")
    return got[:rows]


EMBED_SHAPES = [(50, 128, 0, 1), (37, 384, 3, 7), (300, 2176 + 128, 5, 9)]  # (vocab, dim, first, rows)
EMBED_CASES = [(fmt, EMBED_SHAPES[i % len(EMBED_SHAPES)]) for i, fmt in enumerate(FORMATS)]


@pytest.mark.parametrize("fmt,shape", EMBED_CASES, ids=[f"{f}-{v}x{d}" for f, (v, d, _, _) in EMBED_CASES])
def test_embed(dev, lib, fmt, shape):
    """Exact: each value is the format's dequantized weight (affine: one fma, i.e. the float64
    value rounded once; the others exact products)."""
    vocab, dim, first, rows = shape
    rng = seeded("embed", fmt, vocab, dim)
    wt = Weights.make(rng, fmt, vocab, dim)
    ids = rng.integers(0, vocab, size=first + rows + 2).astype(np.uint32)
    ids[first + rows - 1] = vocab - 1  # the table's last row
    if rows > 1:
        ids[first + 1] = ids[first]  # a repeated token
    got = run_embed(dev, lib, wt, ids, first, rows)
    want = wt.value[ids[first:first + rows]]
    assert np.array_equal(got, want), f"max diff {np.max(np.abs(got - want))}"


def test_embed_bad_id_gives_nan_row(dev, lib):
    rng = seeded("embed-bad")
    vocab, dim = 20, 256
    wt = Weights.make(rng, "b4_g64", vocab, dim)
    ids = np.array([3, vocab, 0xFFFFFFFF, 7], np.uint32)
    got = run_embed(dev, lib, wt, ids, 0, 4)
    assert np.array_equal(got[[0, 3]], wt.value[[3, 7]])
    assert np.isnan(got[1:3]).all()


@pytest.mark.slow
def test_embed_27b(dev, lib):
    """27B hidden 5120 from a table slice; ids near the slice's end."""
    bits, group, vocab, dim = 4, 64, 1024, 5120
    rng = seeded("embed27b")
    wt = weights_from_codes(bits, group, *random_quantized(rng, vocab, dim, bits, group))
    ids = np.array([vocab - 1, 0, 517, vocab - 2], np.uint32)
    got = run_embed(dev, lib, wt, ids, 0, 4)
    assert np.array_equal(got, wt.value[ids])
