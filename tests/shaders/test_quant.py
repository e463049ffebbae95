"""shaders/quant.metal: MLX affine quantized projections and the embedding gather.

Every kernel is compared with float64 numpy (dequantize, then matmul) for all six
(bits, group) variants. Outputs start as NaN and sit between NaN guard rows/columns
(so unwritten and stray writes both fail); sizes straddle the SIMD width and the
kernels' row/tile edges; each 27B projection runs once through the decode matvec on
a slice of its rows, dispatched at a buffer offset. Tolerances: `tol_f32_dot` (f32
accumulation, see quant_reference.py); the embedding gather is exact.
"""

import numpy as np
import pytest

from .. import reference as ref
from .quant_reference import (
    EMBED_THREADS, QMM_THREADS, QMM_TILE_OUT, QMM_TILE_ROWS, QMV_MAX_ROWS, QMV_ROWS_PER_TG,
    QMV_THREADS, VARIANTS, activations, cdiv, embed_params, matmul_params, matmul_ref,
    quantized_weights, random_quantized, seeded, tol_f32_dot)

BF16 = np.uint16  # bf16 tensors travel as their bit patterns


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("quant.metal")


def variant_ids(variants):
    return [f"b{bits}_g{group}" for bits, group in variants]


def weight_buffers(dev, words, sb, bb):
    return dev.buffer(words), dev.buffer(sb.astype(BF16)), dev.buffer(bb.astype(BF16))


def nan_buffer(dev, *shape):
    return dev.buffer(np.full(shape, np.nan, dtype=np.float32))


def run_qmv(dev, lib, bits, group, words, sb, bb, x):
    """qmv on one x row; y has a NaN guard row after out_dim elements."""
    out_dim, in_dim = words.shape[0], x.shape[-1]
    w, s, b = weight_buffers(dev, words, sb, bb)
    y = nan_buffer(dev, out_dim + QMV_ROWS_PER_TG)
    lib.kernel(f"qmv_b{bits}_g{group}").dispatch(
        {0: w, 1: s, 2: b, 3: dev.buffer(x.reshape(-1)), 4: y, 5: matmul_params(in_dim, out_dim)},
        threadgroups=(cdiv(out_dim, QMV_ROWS_PER_TG),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (out_dim + QMV_ROWS_PER_TG,))
    ref.assert_untouched(got[out_dim:], "y past out_dim")
    return got[:out_dim]


def check_matmul(got, words, sb, bb, x, bits, group, what):
    want, typical = matmul_ref(words, sb, bb, x, bits, group)
    ref.assert_close(got, want.reshape(got.shape), tol_f32_dot(x.shape[-1]), what, scale=typical)


# ---------------------------------------------------------------------------
# Reference self-checks


def test_reference_matmul_matches_direct_dequantization():
    rng = seeded("ref")
    words, sb, bb, w = quantized_weights(rng, 5, 256, 4, 64)
    x = activations(rng, 3, 256)
    want, _ = matmul_ref(words, sb, bb, x, 4, 64, chunk=2)
    assert np.allclose(want, x.astype(np.float64) @ w.astype(np.float64).T, rtol=0, atol=1e-12)
    # element j of a word in bits 4j..: code 5 in bits 20..23 is element 5
    assert ref.unpack_bits(np.array([[5 << 20]], np.uint32), 4)[0].tolist() == [0, 0, 0, 0, 0, 5, 0, 0]


# ---------------------------------------------------------------------------
# Decode matvec


QMV_SHAPES = [  # (out_dim, in_dim): in_dim a multiple of 128 so every group size applies;
    # 1024 (0.8B hidden) is exactly one block per lane at 4 bits, 3584 (0.8B intermediate)
    # leaves half the lanes a block short on the last step.
    (1, 128), (7, 384), (8, 1280), (9, 128), (31, 3584), (32, 384),
    (33, 1280), (127, 1024), (128, 384), (129, 640),
]


@pytest.mark.parametrize("bits,group", VARIANTS, ids=variant_ids(VARIANTS))
@pytest.mark.parametrize("out_dim,in_dim", QMV_SHAPES)
def test_qmv(dev, lib, bits, group, out_dim, in_dim):
    rng = seeded("qmv", bits, group, out_dim, in_dim)
    words, sb, bb, _ = quantized_weights(rng, out_dim, in_dim, bits, group)
    x = activations(rng, 1, in_dim)
    got = run_qmv(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, f"qmv_b{bits}_g{group} {out_dim}x{in_dim}")


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 128)], ids=variant_ids([(4, 32), (8, 128)]))
def test_qmv_smallest_row(dev, lib, bits, group):
    """in_dim = one group: fewer blocks than lanes (most lanes contribute nothing)."""
    rng = seeded("qmv-small", bits, group)
    words, sb, bb, _ = quantized_weights(rng, 9, group, bits, group)
    x = activations(rng, 1, group)
    got = run_qmv(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, "qmv one group")


# The 27B projections (DESIGN.md "Real sizes"): (in_dim, out_dim of the whole matrix).
# A slice of `rows_stored` weight rows is made; `rows_run` rows ending at the slice's
# end are computed through buffer offsets (so the row tail sits at the buffer's end).
BIG = [
    pytest.param(5120, 17408, 640, 300, id="gate_up_5120x17408"),
    pytest.param(17408, 5120, 400, 200, id="down_17408x5120"),
    pytest.param(5120, 10240, 520, 260, id="qkv_5120x10240"),
    pytest.param(6144, 5120, 460, 230, id="o_out_6144x5120"),
    pytest.param(5120, 248320, 16384, 300, id="head_5120x248320_slice"),
]


@pytest.mark.parametrize("in_dim,full_out,rows_stored,rows_run", BIG)
def test_qmv_27b(dev, lib, in_dim, full_out, rows_stored, rows_run):
    bits, group = 4, 64  # mlx-community's 4-bit checkpoints
    rng = seeded("qmv27b", in_dim, full_out)
    words, sb, bb = random_quantized(rng, rows_stored, in_dim, bits, group)
    x = activations(rng, 1, in_dim)
    first = rows_stored - rows_run
    w, s, b = weight_buffers(dev, words, sb, bb)
    y = nan_buffer(dev, rows_stored + QMV_ROWS_PER_TG)
    lib.kernel(f"qmv_b{bits}_g{group}").dispatch(
        {0: (w, first * words.shape[1] * 4), 1: (s, first * sb.shape[1] * 2), 2: (b, first * bb.shape[1] * 2),
         3: dev.buffer(x.reshape(-1)), 4: (y, first * 4), 5: matmul_params(in_dim, rows_run)},
        threadgroups=(cdiv(rows_run, QMV_ROWS_PER_TG),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (rows_stored + QMV_ROWS_PER_TG,))
    ref.assert_untouched(got[:first], "y before the slice")
    ref.assert_untouched(got[rows_stored:], "y past the slice")
    check_matmul(got[first:rows_stored], words[first:], sb[first:], bb[first:], x, bits, group,
                 f"qmv {in_dim}->{full_out} rows {first}..{rows_stored}")


def test_qmv_27b_8bit(dev, lib):
    """8-bit weights at the widest input (down_proj, 17408)."""
    bits, group, in_dim, out_dim = 8, 64, 17408, 100
    rng = seeded("qmv27b8")
    words, sb, bb = random_quantized(rng, out_dim, in_dim, bits, group)
    x = activations(rng, 1, in_dim)
    got = run_qmv(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, "qmv_b8 17408")


# ---------------------------------------------------------------------------
# Verify matvec


def run_qmv_rows(dev, lib, bits, group, words, sb, bb, x, x_stride=None, y_stride=None):
    """qmv_rows over the rows of x; returns y [rows][y_stride] plus a NaN guard row."""
    rows, in_dim = x.shape
    out_dim = words.shape[0]
    x_stride = in_dim if x_stride is None else x_stride
    y_stride = out_dim if y_stride is None else y_stride
    xs = np.full((rows, x_stride), np.nan, np.float32)  # stride padding is NaN: must be ignored
    xs[:, :in_dim] = x
    w, s, b = weight_buffers(dev, words, sb, bb)
    y = nan_buffer(dev, rows + 1, y_stride)
    lib.kernel(f"qmv_rows_b{bits}_g{group}").dispatch(
        {0: w, 1: s, 2: b, 3: dev.buffer(xs), 4: y, 5: matmul_params(in_dim, out_dim, rows, x_stride, y_stride)},
        threadgroups=(cdiv(out_dim, QMV_ROWS_PER_TG),), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (rows + 1, y_stride))
    ref.assert_untouched(got[rows:], "y past the last row")
    ref.assert_untouched(got[:rows, out_dim:], "y stride padding")
    return got[:rows, :out_dim]


QMV_ROWS_SHAPES = [(1, 33, 384), (2, 7, 128), (3, 129, 640), (4, 8, 1280),
                   (5, 31, 256), (6, 1, 384), (7, 32, 128), (8, 127, 1280)]


@pytest.mark.parametrize("bits,group", VARIANTS, ids=variant_ids(VARIANTS))
@pytest.mark.parametrize("rows,out_dim,in_dim", QMV_ROWS_SHAPES)
def test_qmv_rows(dev, lib, bits, group, rows, out_dim, in_dim):
    rng = seeded("qmv_rows", bits, group, rows, out_dim, in_dim)
    words, sb, bb, _ = quantized_weights(rng, out_dim, in_dim, bits, group)
    x = activations(rng, rows, in_dim)
    got = run_qmv_rows(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, f"qmv_rows_b{bits}_g{group} {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)], ids=variant_ids([(4, 64), (8, 32)]))
def test_qmv_rows_match_decode_bitwise(dev, lib, bits, group):
    """Verify rows use decode's exact per-row reduction order, so a speculative verify
    step reproduces greedy decode bit for bit (same device, same compiler settings).
    Also exercises row strides wider than the data (NaN-filled gaps)."""
    rows, out_dim, in_dim = QMV_MAX_ROWS, 37, 1280
    rng = seeded("qmv_rows_bitwise", bits, group)
    words, sb, bb, _ = quantized_weights(rng, out_dim, in_dim, bits, group)
    x = activations(rng, rows, in_dim)
    got = run_qmv_rows(dev, lib, bits, group, words, sb, bb, x, x_stride=in_dim + 12, y_stride=out_dim + 5)
    for r in range(rows):
        single = run_qmv(dev, lib, bits, group, words, sb, bb, x[r])
        assert np.array_equal(got[r].view(np.uint32), single.view(np.uint32)), f"row {r} differs from qmv"


def test_qmv_rows_27b(dev, lib):
    """Eight verify rows at the 27B hidden size (5120 -> a slice of q_proj)."""
    bits, group, in_dim, out_dim = 4, 64, 5120, 72
    rng = seeded("qmv_rows27b")
    words, sb, bb = random_quantized(rng, out_dim, in_dim, bits, group)
    x = activations(rng, QMV_MAX_ROWS, in_dim)
    got = run_qmv_rows(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, "qmv_rows 8x5120")


# ---------------------------------------------------------------------------
# Prefill GEMM


def run_qmm(dev, lib, bits, group, words, sb, bb, x, x_stride=None, y_stride=None):
    """qmm over all rows of x. X occupies exactly rows*x_stride floats (no padding rows:
    the kernel must not need them); y has a NaN guard row."""
    rows, in_dim = x.shape
    out_dim = words.shape[0]
    x_stride = in_dim if x_stride is None else x_stride
    y_stride = out_dim if y_stride is None else y_stride
    xs = np.full((rows, x_stride), np.nan, np.float32)
    xs[:, :in_dim] = x
    w, s, b = weight_buffers(dev, words, sb, bb)
    y = nan_buffer(dev, rows + 1, y_stride)
    lib.kernel(f"qmm_b{bits}_g{group}").dispatch(
        {0: w, 1: s, 2: b, 3: dev.buffer(xs), 4: y, 5: matmul_params(in_dim, out_dim, rows, x_stride, y_stride)},
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


@pytest.mark.parametrize("bits,group", VARIANTS, ids=variant_ids(VARIANTS))
@pytest.mark.parametrize("rows,out_dim,in_dim", QMM_SHAPES)
def test_qmm(dev, lib, bits, group, rows, out_dim, in_dim):
    rng = seeded("qmm", bits, group, rows, out_dim, in_dim)
    words, sb, bb, _ = quantized_weights(rng, out_dim, in_dim, bits, group)
    x = activations(rng, rows, in_dim)
    got = run_qmm(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, f"qmm_b{bits}_g{group} {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)], ids=variant_ids([(4, 32), (8, 64)]))
def test_qmm_strided_and_one_group(dev, lib, bits, group):
    """Row strides wider than the data (NaN gaps must be ignored / left alone), and the
    shortest K (one K-step) next to a long one."""
    rng = seeded("qmm-strided", bits, group)
    for rows, out_dim, in_dim in [(9, 65, 32 if group == 32 else 64), (33, 64, 640)]:
        words, sb, bb, _ = quantized_weights(rng, out_dim, in_dim, bits, group)
        x = activations(rng, rows, in_dim)
        got = run_qmm(dev, lib, bits, group, words, sb, bb, x, x_stride=in_dim + 8, y_stride=out_dim + 3)
        check_matmul(got, words, sb, bb, x, bits, group, f"qmm strided {rows}x{out_dim}x{in_dim}")


@pytest.mark.parametrize("in_dim,out_dim", [(5120, 72), (17408, 40)])
def test_qmm_27b(dev, lib, in_dim, out_dim):
    """Prefill at the 27B widths (hidden 5120, intermediate 17408): 33 rows (a partial row
    tile), a slice of the outputs."""
    bits, group, rows = 4, 64, 33
    rng = seeded("qmm27b", in_dim)
    words, sb, bb = random_quantized(rng, out_dim, in_dim, bits, group)
    x = activations(rng, rows, in_dim)
    got = run_qmm(dev, lib, bits, group, words, sb, bb, x)
    check_matmul(got, words, sb, bb, x, bits, group, f"qmm 33x{in_dim}")


# ---------------------------------------------------------------------------
# Embedding gather


def run_embed(dev, lib, bits, group, words, sb, bb, ids, first, rows):
    vocab, dim = words.shape[0], words.shape[1] * 32 // bits
    w, s, b = weight_buffers(dev, words, sb, bb)
    hidden = nan_buffer(dev, rows + 1, dim)
    per_block = 128 // bits
    lib.kernel(f"embed_b{bits}_g{group}").dispatch(
        {0: w, 1: s, 2: b, 3: dev.buffer(np.asarray(ids, np.uint32)), 4: hidden,
         5: embed_params(dim, vocab, first, rows)},
        threadgroups=(cdiv(dim // per_block, EMBED_THREADS), rows), threads=(EMBED_THREADS,))
    got = hidden.numpy(np.float32, (rows + 1, dim))
    ref.assert_untouched(got[rows:], "hidden past the last row")
    return got[:rows]


@pytest.mark.parametrize("bits,group", VARIANTS, ids=variant_ids(VARIANTS))
@pytest.mark.parametrize("vocab,dim,first,rows", [(50, 128, 0, 1), (37, 384, 3, 7), (300, 2176, 5, 9)])
def test_embed(dev, lib, bits, group, vocab, dim, first, rows):
    """Exact: each value is one fma(scale, q, bias), i.e. the float64 value rounded once."""
    rng = seeded("embed", bits, group, vocab, dim)
    words, sb, bb, table = quantized_weights(rng, vocab, dim, bits, group)
    ids = rng.integers(0, vocab, size=first + rows + 2).astype(np.uint32)
    ids[first + rows - 1] = vocab - 1  # the table's last row
    if rows > 1:
        ids[first + 1] = ids[first]  # a repeated token
    got = run_embed(dev, lib, bits, group, words, sb, bb, ids, first, rows)
    want = table[ids[first:first + rows]]
    assert np.array_equal(got, want), f"max diff {np.max(np.abs(got - want))}"


def test_embed_bad_id_gives_nan_row(dev, lib):
    rng = seeded("embed-bad")
    vocab, dim = 20, 256
    words, sb, bb, table = quantized_weights(rng, vocab, dim, 4, 64)
    ids = np.array([3, vocab, 0xFFFFFFFF, 7], np.uint32)
    got = run_embed(dev, lib, 4, 64, words, sb, bb, ids, 0, 4)
    assert np.array_equal(got[[0, 3]], table[[3, 7]])
    assert np.isnan(got[1:3]).all()


def test_embed_27b(dev, lib):
    """27B hidden 5120 from a table slice; ids near the slice's end."""
    bits, group, vocab, dim = 4, 64, 1024, 5120
    rng = seeded("embed27b")
    words, sb, bb = random_quantized(rng, vocab, dim, bits, group)
    ids = np.array([vocab - 1, 0, 517, vocab - 2], np.uint32)
    got = run_embed(dev, lib, bits, group, words, sb, bb, ids, 0, 4)
    want = ref.dequantize(words[ids], sb[ids], bb[ids], group, bits)
    assert np.array_equal(got, want)
