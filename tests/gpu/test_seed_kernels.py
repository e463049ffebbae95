"""The seed kernel library (another engine's forward.metal, METALQWEN_SEED_METAL), run through metalqwen.gpu.

Each kernel is checked against a numpy reference written from docs/design.md's math and
the buffer layouts the seed documents, never from the kernel's code. The seed is
real, tuned GPU code: where a test and the seed disagree on the CPU runtime, the
runtime is at fault. Outputs are pre-filled with NaN (or another value the kernel
cannot produce) so unwritten elements fail, and the regions a kernel must leave
alone are checked to be untouched. Sizes straddle SIMD/tile edges; each major
kernel also runs one 27B-sized shape (hidden 5120, docs/design.md "Real sizes"), cut to a
slice of output rows to keep the file fast on the CPU runtime.

Tolerances (the `TOL_*` constants and `tol_f32_sum`) are stated per numeric path
with the reason for their size; they hold for the CPU runtime and for a GPU
running Metal's default fast math.
"""

import math
import os
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from ..support import reference as ref

# The seed library (another engine's forward.metal) is not part of this repository:
# METALQWEN_SEED_METAL names it where a machine has it (docs/testing.md, "The seed kernel library").
SEED = os.environ.get("METALQWEN_SEED_METAL")

GROUP = 64  # the seed's GROUP_SIZE
BITS = 4  # the seed's quantized kernels are affine 4-bit
HEAD_DIM = 256  # attention kernels: lanes cover 2 x 32 x float4
D_K = 128  # DeltaNet kernels: 32 lanes x float4 of the key dim

# ---------------------------------------------------------------------------
# Tolerances

U32 = 2.0**-24  # f32 unit roundoff
U16 = 2.0**-11  # f16 unit roundoff


def tol_f32_sum(n):
    """f32 accumulation of n products, relative to the typical output size.

    Rounding errors random-walk to about u*sqrt(n) of the typical output: float32
    sums of these data (with their large outlier channels) measured at most
    5.1 u sqrt(n) over 20 seeds and three summation orders. 16 u sqrt(n) leaves 3x
    for any order, while a precision bug (half accumulation, ~1e-3) or a misplaced
    element (~1) fails by orders of magnitude.
    """
    return 16 * U32 * math.sqrt(n)


# qmv_multi_h/_hn take x as half and sum 8 code*x products per lane in half before
# promoting to f32. Each half fma rounds at 2^-11 of a partial sum of scale*q*x terms
# several times larger than the output (the affine bias*sum(x) term cancels most of
# it), and the outlier channels make those partials large. A rounding model of exactly
# that math (the CPU runtime matches it to 1e-6) gives errors of rms <= 1.6e-3 and
# max <= 1.3e-2 of the typical output over 150 random 8 x 129 outputs (in_dim 64 to
# 5120). The max bound allows 2.3x over that tail and is still 30x below one misplaced
# element; the rms bound (checked where >= 64 outputs average out) allows 2.5x and
# catches small systematic errors such as one dropped 32-element group.
TOL_HALF_DOT_MAX = 3e-2
TOL_HALF_DOT_RMS = 4e-3

# Elementwise f32 paths through exp/log/rsqrt: Metal's fast-math exp is within
# (3 + 2|x|) ulp, i.e. <= 4e-6 relative for |x| <= 30; rsqrt within 2 ulp. 2e-5 gives
# 5x margin; the CPU runtime uses libm and lands near 1e-7.
TOL_FAST = 2e-5

# f32 recurrences / reductions without transcendental loss (DeltaNet scan, norms):
# a float32 simulation of the scan differs from float64 by <= 2.3e-7 (normwise) over
# 100 tokens because the update contracts; 1e-5 leaves room for any reduction order.
TOL_F32 = 1e-5

# Flash-decode attention: 256-term f32 dots, exp2 under fast math ((3 + 2|x|) ulp
# for |x| <= 30, i.e. <= 4e-6), sums over up to 100 positions: 5e-5 normwise.
TOL_ATTN = 5e-5


# ---------------------------------------------------------------------------
# Helpers


def seeded(*key):
    """A generator whose seed depends only on the test case (stable across runs)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def u32(*values):
    return np.array(values, dtype=np.uint32)


def cdiv(a, b):
    return -(-a // b)


def nan_f32(device, *shape):
    return device.buffer(np.full(shape, np.nan, dtype=np.float32))


def nan_f16(device, *shape):
    return device.buffer(np.full(shape, np.nan, dtype=np.float16))


def activations(rng, rows, n):
    """Hidden-state-like rows: N(0, 1) with a few large channels shared by all rows."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    cols = rng.choice(n, size=min(4, n), replace=False)
    x[:, cols] *= 20.0
    return x


def quantized_weights(rng, out_dim, in_dim):
    """A 4-bit, group-64 MLX projection with rows of different magnitude.

    Returns (words, scale bits, bias bits, dequantized float32 [out, in]).
    """
    w = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    w *= (0.02 * rng.uniform(0.5, 2.0, (out_dim, 1))).astype(np.float32)
    words, sb, bb = ref.quantize(w, GROUP, BITS)
    return words, sb, bb, ref.dequantize(words, sb, bb, GROUP, BITS)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.fixture(scope="session")
def seed_lib(device):
    if not SEED:
        pytest.skip("METALQWEN_SEED_METAL is unset: the seed kernel library is not part of "
                    "the repository (docs/testing.md)")
    return device.compile(Path(SEED).read_text())


# ---------------------------------------------------------------------------
# Self-checks of the numpy references (no device needed)


def test_reference_bf16_rounds_to_nearest_even():
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, -2.0, np.pi, 3.4e38],
                      dtype=np.float32)
    want = [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000, 0x4049, 0x7F80]
    assert ref.bf16_bits(values).tolist() == want
    assert np.isnan(ref.bf16_to_f32(ref.bf16_bits(np.array([np.nan], np.float32))))[0]


def test_reference_quantize_round_trip():
    rng = seeded("quantize")
    w = (rng.standard_normal((5, 256)) * 0.02).astype(np.float32)
    words, sb, bb = ref.quantize(w, GROUP, BITS)
    assert words.shape == (5, 32) and sb.shape == bb.shape == (5, 4)
    assert ref.pack_bits(np.array([[1, 2, 3, 4, 5, 6, 7, 8]]), 4)[0, 0] == 0x87654321
    deq = ref.dequantize(words, sb, bb, GROUP, BITS)
    scale = ref.bf16_to_f32(sb)
    assert (scale < 0).any() and (scale > 0).any()  # both signs occur, as in checkpoints
    for r, i in [(0, 0), (1, 63), (2, 64), (4, 255), (3, 130)]:
        code = (int(words[r, i // 8]) >> (4 * (i % 8))) & 0xF
        direct = np.float32(float(scale[r, i // GROUP]) * code + float(ref.bf16_to_f32(bb)[r, i // GROUP]))
        assert deq[r, i] == direct
    step = np.repeat(np.abs(scale), GROUP, axis=1)
    assert np.all(np.abs(deq - w) <= 0.5 * step + 2**-8 * np.abs(w).max())


# ---------------------------------------------------------------------------
# The library itself


def test_seed_library_resolves_every_kernel(seed_lib):
    from metalqwen import gpu

    names = re.findall(r"^kernel void (\w+)\(", Path(SEED).read_text(), flags=re.M)
    assert len(names) >= 20
    for name in names:
        assert seed_lib.kernel(name).max_threads_per_threadgroup >= 32, name
    with pytest.raises(gpu.GpuError, match="no_such_kernel"):
        seed_lib.kernel("no_such_kernel")


# ---------------------------------------------------------------------------
# Quantized projections: deinterleave_bh + qmv_multi_h / qmv_multi_hn


def run_deinterleave(device, lib, x, style="grid"):
    """x [nb][in_dim] f32 -> (xe, xo, xsum) buffers, each with one NaN sentinel row."""
    nb, in_dim = x.shape
    n2 = in_dim // 2
    xe = nan_f16(device, nb + 1, n2)
    xo = nan_f16(device, nb + 1, n2)
    xs = nan_f32(device, nb + 1, in_dim // 32)
    args = {0: device.buffer(x), 1: xe, 2: xo, 3: u32(n2), 4: u32(nb), 5: xs}
    kernel = lib.kernel("deinterleave_bh")
    if style == "grid":
        kernel.dispatch_threads(args, grid=(nb * n2,), threads=(256,))
    else:  # whole groups; threads past nb*n2 leave through the kernel's guard
        kernel.dispatch(args, threadgroups=(cdiv(nb * n2, 128),), threads=(128,))
    return xe, xo, xs


@pytest.mark.parametrize("nb,in_dim,style", [
    (1, 64, "grid"),
    (3, 192, "groups"),
    (8, 1024, "grid"),
    (2, 5120, "groups"),  # 27B hidden
])
def test_deinterleave_bh(device, seed_lib, nb, in_dim, style):
    rng = seeded("deinterleave", nb, in_dim)
    x = activations(rng, nb, in_dim)
    xe, xo, xs = run_deinterleave(device, seed_lib, x, style)
    n2 = in_dim // 2
    got_e = xe.numpy(np.float16, (nb + 1, n2)).astype(np.float32)
    got_o = xo.numpy(np.float16, (nb + 1, n2)).astype(np.float32)
    got_s = xs.numpy(np.float32, (nb + 1, in_dim // 32))
    # Even/odd elements as half: one rounding each, within half an ulp (U16
    # relative; 2^-25 absolute in the subnormal range).
    even, odd = x[:, 0::2], x[:, 1::2]
    ref.assert_within(got_e[:nb], even, U16 * np.abs(even) + 2.0**-25, "xe")
    ref.assert_within(got_o[:nb], odd, U16 * np.abs(odd) + 2.0**-25, "xo")
    # Sums of 32 consecutive f32 elements: any order is within gamma_31 < 32u of
    # the sum of magnitudes.
    groups = x.reshape(nb, in_dim // 32, 32).astype(np.float64)
    ref.assert_within(got_s[:nb], groups.sum(-1), 32 * U32 * np.abs(groups).sum(-1), "xsum")
    ref.assert_untouched(got_e[nb:], "xe past nb rows")
    ref.assert_untouched(got_o[nb:], "xo past nb rows")
    ref.assert_untouched(got_s[nb:], "xsum past nb rows")


QMV_CASES = [
    # kernel, nb, out_dim, in_dim, simdgroups per threadgroup
    ("qmv_multi_h", 1, 1, 64, 1),
    ("qmv_multi_h", 2, 7, 128, 2),
    ("qmv_multi_h", 3, 8, 192, 4),
    ("qmv_multi_h", 1, 9, 1024, 8),
    ("qmv_multi_h", 2, 31, 64, 4),
    ("qmv_multi_h", 3, 32, 256, 2),
    ("qmv_multi_h", 1, 33, 320, 4),
    ("qmv_multi_h", 2, 127, 128, 8),
    ("qmv_multi_h", 3, 128, 64, 4),
    ("qmv_multi_h", 1, 129, 512, 4),
    ("qmv_multi_h", 3, 129, 5120, 4),  # 27B: hidden -> a slice of q_proj rows
    ("qmv_multi_h", 1, 9, 17408, 2),  # 27B: down_proj's input width
    ("qmv_multi_hn", 1, 33, 128, 4),
    ("qmv_multi_hn", 2, 1, 64, 1),
    ("qmv_multi_hn", 3, 9, 192, 2),
    ("qmv_multi_hn", 4, 31, 256, 4),
    ("qmv_multi_hn", 5, 32, 64, 8),
    ("qmv_multi_hn", 6, 127, 320, 4),
    ("qmv_multi_hn", 7, 128, 128, 2),
    ("qmv_multi_hn", 8, 129, 192, 4),
    ("qmv_multi_hn", 8, 7, 1024, 1),
    ("qmv_multi_hn", 8, 33, 5120, 4),  # 27B hidden, 8 verify rows
]


@pytest.mark.parametrize("kernel,nb,out_dim,in_dim,spt", QMV_CASES)
def test_qmv_half(device, seed_lib, kernel, nb, out_dim, in_dim, spt):
    """y[b] = W x[b] with W 4-bit affine, x given as half even/odd streams + f32 group sums."""
    rng = seeded(kernel, nb, out_dim, in_dim)
    words, sb, bb, w = quantized_weights(rng, out_dim, in_dim)
    x = activations(rng, nb, in_dim)
    xe, xo, xs = run_deinterleave(device, seed_lib, x)
    rows = 3 if kernel == "qmv_multi_h" else 8
    y = nan_f32(device, rows + 1, out_dim)
    seed_lib.kernel(kernel).dispatch(
        {0: device.buffer(words), 1: device.buffer(sb), 2: device.buffer(bb), 3: xe, 4: xo, 5: y,
         6: u32(out_dim, in_dim), 7: u32(nb), 8: xs},
        threadgroups=(cdiv(out_dim, spt),), threads=(32 * spt,))
    got = y.numpy(np.float32, (rows + 1, out_dim))
    # The math with the operands the kernel documents: scale*q against x rounded
    # to half, bias against the f32 sums of x.
    codes = ref.unpack_bits(words, BITS).astype(np.float64)
    scale = np.repeat(ref.bf16_to_f32(sb).astype(np.float64), GROUP, axis=1)
    bias = np.repeat(ref.bf16_to_f32(bb).astype(np.float64), GROUP, axis=1)
    want = ref.round_f16(x).astype(np.float64) @ (scale * codes).T + x.astype(np.float64) @ bias.T
    typical = ref.typical_dot(w, x)
    ref.assert_close(got[:nb], want, TOL_HALF_DOT_MAX, f"{kernel} y", scale=typical)
    if want.size >= 64:
        rms = float(np.sqrt(np.mean((got[:nb] - want) ** 2))) / typical
        assert rms <= TOL_HALF_DOT_RMS, f"{kernel} y: rms error {rms:.3g} of the typical output"
    ref.assert_untouched(got[nb:], f"{kernel} rows past nb")


# ---------------------------------------------------------------------------
# Quantized GEMMs: qmm_af4_w (32-token tiles), qmm_af4_n8, qmm_af4_n16

QMM_TILE = {"qmm_af4_w": 32, "qmm_af4_n8": 8, "qmm_af4_n16": 16}

QMM_CASES = [
    # kernel, nb, out_dim, in_dim
    ("qmm_af4_w", 1, 8, 64),
    ("qmm_af4_w", 7, 120, 128),
    ("qmm_af4_w", 32, 128, 64),
    ("qmm_af4_w", 33, 136, 192),
    ("qmm_af4_w", 31, 256, 128),
    ("qmm_af4_w", 9, 9, 64),  # out_dim % 8 != 0: the partial fragment is not stored
    ("qmm_af4_w", 33, 33, 64),
    ("qmm_af4_w", 33, 128, 5120),  # 27B hidden, a 128-row slice, two token tiles
    ("qmm_af4_n8", 1, 8, 64),
    ("qmm_af4_n8", 3, 128, 128),
    ("qmm_af4_n8", 8, 136, 192),
    ("qmm_af4_n8", 5, 9, 64),
    ("qmm_af4_n8", 13, 64, 128),  # two 8-token tiles
    ("qmm_af4_n8", 8, 128, 5120),  # 27B hidden
    ("qmm_af4_n16", 9, 8, 64),
    ("qmm_af4_n16", 16, 136, 128),
    ("qmm_af4_n16", 12, 33, 192),
    ("qmm_af4_n16", 17, 128, 64),  # two 16-token tiles
    ("qmm_af4_n16", 16, 128, 5120),  # 27B hidden
]


@pytest.mark.parametrize("kernel,nb,out_dim,in_dim", QMM_CASES)
def test_qmm_af4(device, seed_lib, kernel, nb, out_dim, in_dim):
    """y[b] = W x[b] for token tiles of 32/8/16 rows, 128 output rows per threadgroup.

    The caller pads x to whole token tiles (the seed's qmm_from contract); the
    kernel stores every row of a tile, so padding rows (zeros here) come back 0.
    Output is stored in whole 8-column fragments only: with out_dim % 8 != 0 the
    last partial fragment is never written and must stay NaN.
    """
    tile = QMM_TILE[kernel]
    ntt = cdiv(nb, tile)
    padded = ntt * tile
    rng = seeded(kernel, nb, out_dim, in_dim)
    words, sb, bb, w = quantized_weights(rng, out_dim, in_dim)
    x = np.zeros((padded, in_dim), dtype=np.float32)
    x[:nb] = activations(rng, nb, in_dim)
    y = nan_f32(device, padded + 1, out_dim)
    seed_lib.kernel(kernel).dispatch(
        {0: device.buffer(words), 1: device.buffer(sb), 2: device.buffer(bb), 3: device.buffer(x),
         4: y, 5: u32(out_dim, in_dim), 6: u32(ntt)},
        threadgroups=(cdiv(out_dim, 128) * ntt,), threads=(128,))
    got = y.numpy(np.float32, (padded + 1, out_dim))
    # Operands as the kernel stages them (half tiles: dequantized weights and x
    # rounded to half), accumulated exactly; only the f32 accumulation differs.
    want = ref.round_f16(x[:nb]).astype(np.float64) @ ref.round_f16(w).astype(np.float64).T
    full = out_dim - out_dim % 8
    ref.assert_close(got[:nb, :full], want[:, :full], tol_f32_sum(in_dim), f"{kernel} y",
                     scale=ref.typical_dot(w, x[:nb]))
    assert np.all(got[nb:padded, :full] == 0.0), f"{kernel}: padding rows of the tile are not 0"
    ref.assert_untouched(got[:padded, full:], f"{kernel} partial 8-column fragment")
    ref.assert_untouched(got[padded:], f"{kernel} rows past the token tiles")


# ---------------------------------------------------------------------------
# gemm_hh: C[m][n] = sum_k A[m][k] B[n][k], half in, f32 out


@pytest.mark.parametrize("m,n,k", [
    (1, 32, 32),
    (7, 64, 256),
    (8, 32, 64),
    (9, 96, 32),
    (33, 32, 256),
    (128, 32, 96),
    (129, 64, 64),
    (33, 64, 256),  # 27B prefill attention: 33 tokens x 64 cached positions x head_dim
])
def test_gemm_hh(device, seed_lib, m, n, k):
    """Strided A/B/C; n is a multiple of 32 (the caller rounds it up).

    Columns of A and B past k hold NaN, so reading past the contraction shows.
    Whole 8-row fragments that start below m are stored (rows up to m rounded up
    to 8; the caller allocates them), so rows from there on and columns past n
    must stay NaN.
    """
    rng = seeded("gemm_hh", m, n, k)
    lda, ldb, ldc = k + 8, k + 24, n + 8
    a = np.full((m, lda), np.nan, dtype=np.float16)
    b = np.full((n, ldb), np.nan, dtype=np.float16)
    a[:, :k] = rng.standard_normal((m, k)).astype(np.float16)
    b[:, :k] = rng.standard_normal((n, k)).astype(np.float16)
    rows_stored = cdiv(m, 8) * 8
    c = nan_f32(device, rows_stored + 8, ldc)
    seed_lib.kernel("gemm_hh").dispatch(
        {0: device.buffer(a), 1: device.buffer(b), 2: c, 3: u32(m, n, k, lda, ldb, ldc)},
        threadgroups=(cdiv(m, 128) * (n // 32),), threads=(128,))
    got = c.numpy(np.float32, (rows_stored + 8, ldc))
    a64 = a[:, :k].astype(np.float64)
    b64 = b[:, :k].astype(np.float64)
    ref.assert_close(got[:m, :n], a64 @ b64.T, tol_f32_sum(k), "gemm_hh C",
                     scale=ref.typical_dot(b64, a64))
    ref.assert_untouched(got[:, n:], "gemm_hh columns past n")
    ref.assert_untouched(got[rows_stored:], "gemm_hh rows past the stored fragments")


# ---------------------------------------------------------------------------
# Attention: qk_norm_rope_b


def rope_reference(h, w, pos, rot, theta, eps):
    """Per-head RMSNorm (weights stored shifted) then half-split RoPE on the first rot dims."""
    h = h.astype(np.float64)
    out = h / np.sqrt(np.mean(h * h) + eps) * w
    half = rot // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / rot)
    ang = pos * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    a, b = out[:half].copy(), out[half:rot].copy()
    out[:half] = a * c - b * s
    out[half:rot] = b * c + a * s
    return out


@pytest.mark.parametrize("n_heads,head_dim,stride,rot,pos,nb,spt,theta", [
    (3, 256, 512, 64, 0, 1, 4, 1e7),  # q blocks [query|gate]; position 0 rotates nothing
    (2, 256, 256, 64, 5, 7, 2, 1e7),  # k heads, contiguous
    (5, 128, 160, 32, 100, 3, 1, 1e4),  # other head size, gaps between heads
    (1, 256, 512, 64, 4000, 2, 1, 1e7),  # long context
    (24, 256, 512, 64, 37, 2, 4, 1e7),  # 27B q heads
    (4, 256, 256, 64, 37, 3, 8, 1e7),  # 27B kv heads
])
def test_qk_norm_rope_b(device, seed_lib, n_heads, head_dim, stride, rot, pos, nb, spt, theta):
    rng = seeded("rope", n_heads, head_dim, stride, pos, nb)
    eps = 1e-6
    # One extra token row: it is outside nb and must come back bit-identical.
    x = (rng.standard_normal((nb + 1, n_heads * stride)) * rng.uniform(0.2, 3.0)).astype(np.float32)
    w_bits = ref.bf16_bits(rng.uniform(0.5, 1.5, head_dim).astype(np.float32))
    w = ref.bf16_to_f32(w_bits).astype(np.float64)
    buf = device.buffer(x)
    params = struct.pack("<5I2f", n_heads, head_dim, stride, rot, pos, theta, eps)
    seed_lib.kernel("qk_norm_rope_b").dispatch(
        {0: buf, 1: device.buffer(w_bits), 2: params, 3: u32(nb)},
        threadgroups=(cdiv(nb * n_heads, spt),), threads=(32 * spt,))
    got = buf.numpy(np.float32, (nb + 1, n_heads * stride))
    for b in range(nb):
        for head in range(n_heads):
            base = head * stride
            want = rope_reference(x[b, base:base + head_dim], w, pos + b, rot, theta, eps)
            g = got[b, base:base + head_dim]
            mag = np.max(np.abs(want))
            # Unrotated dims: f32 norm (256-term sum, rsqrt within 2 ulp).
            ref.assert_within(g[rot:], want[rot:], TOL_F32 * mag, f"norm b={b} head={head}")
            # Rotated dims: fast-math sin/cos are within 2^-13 absolute on [-pi, pi];
            # the f32 angle pos*inv_freq (pow within a few ulp) is off by up to
            # ~4e-7 * position radians.
            bound = (2.0**-12 + 4e-7 * (pos + b)) * mag * 2
            ref.assert_within(g[:rot], want[:rot], bound, f"rope b={b} head={head}")
            assert np.array_equal(got[b, base + head_dim:base + stride], x[b, base + head_dim:base + stride]), \
                f"qk_norm_rope_b wrote past head_dim (b={b} head={head})"
    assert np.array_equal(got[nb], x[nb]), "qk_norm_rope_b touched a row past nb"


# ---------------------------------------------------------------------------
# Attention: the q8 KV cache (kv_append_q8) and flash-decode (attn_part2_q8 + attn_combine)

Q8_SENTINEL = -128  # the quantizer clamps to +-127, so -128 is never written
F16_NAN_BITS = 0x7E00


def new_q8_cache(device, max_t, row):
    """One side of the cache: int8 plane [max_t][row], then f16 scales [max_t][row/32]."""
    scale_off = max_t * row
    raw = np.empty(scale_off + max_t * (row // 32) * 2, dtype=np.uint8)
    raw[:scale_off] = np.uint8(Q8_SENTINEL & 0xFF)
    raw[scale_off:].view(np.uint16)[:] = F16_NAN_BITS
    return device.buffer(raw), scale_off


def read_q8_cache(buf, max_t, row):
    raw = buf.numpy(np.uint8, (max_t * row + max_t * (row // 32) * 2,))
    q = raw[:max_t * row].view(np.int8).reshape(max_t, row)
    d = raw[max_t * row:].view(np.float16).reshape(max_t, row // 32)
    return q, d


def kv_append(device, lib, k, v, kc, vc, t0, scale_off, spt=4):
    nb, row = k.shape
    blocks = nb * (row // 32) * 2  # one simdgroup per 32-element block, K and V
    lib.kernel("kv_append_q8").dispatch(
        {0: device.buffer(k), 1: device.buffer(v), 2: kc, 3: vc, 4: u32(row, t0, nb, scale_off)},
        threadgroups=(cdiv(blocks, spt),), threads=(32 * spt,))


def kv_rows(rng, nb, row):
    """Post-norm K/V rows whose 32-element blocks span two decades of magnitude."""
    x = rng.standard_normal((nb, row // 32, 32)) * 10.0 ** rng.uniform(-1.0, 1.0, (nb, row // 32, 1))
    return x.reshape(nb, row).astype(np.float32)


@pytest.mark.parametrize("row,t0,nb,max_t,spt", [
    (256, 0, 1, 4, 1),
    (256, 3, 7, 12, 4),
    (512, 0, 33, 36, 8),
    (1024, 5, 3, 9, 4),  # 27B: 4 kv heads x 256
    (1024, 1, 32, 34, 8),
])
def test_kv_append_q8(device, seed_lib, row, t0, nb, max_t, spt):
    """Symmetric int8 per 32 elements: d = amax/127 stored as f16, q = round(x/d), at rows t0.."""
    rng = seeded("kv_append", row, t0, nb)
    k = kv_rows(rng, nb, row)
    v = kv_rows(rng, nb, row)
    k[0, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    v[-1, :32] = 0.0
    v[-1, 5] = -3.0  # a block with one non-zero element
    kc, scale_off = new_q8_cache(device, max_t, row)
    vc, _ = new_q8_cache(device, max_t, row)
    kv_append(device, seed_lib, k, v, kc, vc, t0, scale_off, spt)
    for side, src, buf in (("K", k, kc), ("V", v, vc)):
        q, d = read_q8_cache(buf, max_t, row)
        rows = slice(t0, t0 + nb)
        blocks = src.reshape(nb, row // 32, 32).astype(np.float64)
        amax = np.abs(blocks).max(-1)
        d_want = amax / 127.0
        d_got = d[rows].astype(np.float64)
        # amax/127 in f32, then one rounding to f16 (block magnitudes keep d in
        # the normal f16 range).
        ref.assert_within(d_got, d_want, (U16 + 2 * U32) * d_want, f"{side} scales")
        qb = q[rows].reshape(nb, row // 32, 32).astype(np.float64)
        assert np.all(np.abs(qb) <= 127), f"{side}: code out of [-127, 127]"
        # Round to nearest: |q - x/d| <= 1/2 (f32 division: + 1e-3 slack at ties).
        safe = np.where(d_want > 0, d_want, 1.0)[..., None]
        ratio = np.where(d_want[..., None] > 0, blocks / safe, 0.0)
        ref.assert_within(qb, ratio, 0.5 + 1e-3, f"{side} codes")
        peak = np.abs(blocks).argmax(-1)[..., None]
        at_peak = np.take_along_axis(qb, peak, -1)[..., 0]
        want_peak = np.where(amax > 0, 127.0 * np.sign(np.take_along_axis(blocks, peak, -1)[..., 0]), 0.0)
        assert np.array_equal(at_peak, want_peak), f"{side}: the block maximum is not coded +-127"
        outside = np.ones(max_t, dtype=bool)
        outside[rows] = False
        assert np.all(q[outside] == Q8_SENTINEL), f"{side}: codes written outside rows [t0, t0+nb)"
        assert np.all(d[outside].view(np.uint16) == F16_NAN_BITS), \
            f"{side}: scales written outside rows [t0, t0+nb)"


def attention_partials_reference(qh, kd, vd, scale_log2, n_wg, iwg):
    """Flash-decode record of one worker: positions in its 32-position chunks c = iwg (mod n_wg).

    Returns (m, s, o) with scores in log2 units: m = max score, s = sum 2^(score - m),
    o = sum 2^(score - m) v; (-inf, 0, 0) for a worker without positions.
    """
    t = np.arange(kd.shape[0])
    mine = (t // 32) % n_wg == iwg
    if not mine.any():
        return -np.inf, 0.0, np.zeros(vd.shape[1])
    sc = (kd[mine] @ qh) * scale_log2
    m = sc.max()
    p = np.exp2(sc - m)
    return m, p.sum(), p @ vd[mine]


ATTN_CASES = [
    # n_heads, n_kv, t_len, first append, n_wg, combine threads, extra simdgroup, q token, out_off
    (2, 1, 1, 1, 1, 64, False, 0, 0),
    (4, 2, 7, 3, 2, 256, False, 1, 16),  # worker 1 has no positions
    (4, 1, 32, 16, 1, 32, True, 0, 0),  # an idle simdgroup past n_rep
    (6, 2, 33, 32, 2, 128, False, 1, 256),
    (8, 2, 100, 50, 3, 64, False, 0, 8),  # 4 chunks over 3 workers
    (24, 4, 77, 70, 2, 256, False, 1, 0),  # 27B: 24 q heads over 4 kv heads
]


@pytest.mark.parametrize("n_heads,n_kv,t_len,t_split,n_wg,comb_threads,extra_sg,q_tok,out_off", ATTN_CASES)
def test_attention_decode_q8(device, seed_lib, n_heads, n_kv, t_len, t_split, n_wg, comb_threads,
                             extra_sg, q_tok, out_off):
    """Decode attention of one token over the q8 cache, with GQA and the sigmoid gate.

    The cache is filled by kv_append_q8 in two appends (positions [0, t_split) then
    [t_split, t_len)); the reference runs on the cache's dequantized values, so the
    q8 rounding itself is not part of the comparison.

    `scale` in AttnPartParams is log2(e) / sqrt(head_dim): the kernels exponentiate
    with exp2, so scores and the partial maxima m are in log2 units and
    2^(score * log2(e) / 16) = e^(q.k / 16), the softmax of docs/design.md, "Full attention".
    """
    hd = HEAD_DIM
    n_rep = n_heads // n_kv
    kv_row = n_kv * hd
    max_t = t_len + 3
    rng = seeded("attention", n_heads, n_kv, t_len, n_wg)
    k_rows = (rng.standard_normal((t_len, kv_row)) * 1.3).astype(np.float32)
    v_rows = rng.standard_normal((t_len, kv_row)).astype(np.float32)
    kc, scale_off = new_q8_cache(device, max_t, kv_row)
    vc, _ = new_q8_cache(device, max_t, kv_row)
    kv_append(device, seed_lib, k_rows[:t_split], v_rows[:t_split], kc, vc, 0, scale_off)
    if t_split < t_len:
        kv_append(device, seed_lib, k_rows[t_split:], v_rows[t_split:], kc, vc, t_split, scale_off)

    # q for two tokens, [token][head][query(256) | gate(256)]; the kernels read token q_tok.
    q = np.empty((2, n_heads, 2 * hd), dtype=np.float32)
    q[..., :hd] = rng.standard_normal((2, n_heads, hd)) * 1.3
    q[..., hd:] = rng.standard_normal((2, n_heads, hd)) * 2.0
    q_off = q_tok * n_heads * 2 * hd
    max_blk = n_wg + 1
    scale_log2 = math.log2(math.e) / math.sqrt(hd)
    params = struct.pack("<7If", n_heads, n_kv, hd, t_len, 2 * hd, q_off, max_blk, scale_log2)
    qbuf = device.buffer(q)
    part = nan_f32(device, n_heads, max_blk, 2 + hd)
    seed_lib.kernel("attn_part2_q8").dispatch(
        {0: qbuf, 1: kc, 2: vc, 3: part, 4: params, 5: u32(n_wg), 6: u32(scale_off)},
        threadgroups=(n_kv * n_wg,), threads=(32 * (n_rep + int(extra_sg)),))
    out_len = out_off + n_heads * hd + 16
    out = nan_f32(device, out_len)
    seed_lib.kernel("attn_combine").dispatch(
        {0: qbuf, 1: part, 2: out, 3: params, 4: u32(n_wg), 5: u32(out_off)},
        threadgroups=(n_heads,), threads=(comb_threads,))

    qc, dc = read_q8_cache(kc, max_t, kv_row)
    qv, dv = read_q8_cache(vc, max_t, kv_row)
    kd = (qc[:t_len].astype(np.float64) * np.repeat(dc[:t_len].astype(np.float64), 32, axis=1))
    vd = (qv[:t_len].astype(np.float64) * np.repeat(dv[:t_len].astype(np.float64), 32, axis=1))

    got_part = part.numpy(np.float32, (n_heads, max_blk, 2 + hd))
    got_out = out.numpy(np.float32, (out_len,))
    want_out = np.empty((n_heads, hd))
    for h in range(n_heads):
        kvh = h // n_rep  # GQA: consecutive q heads share a kv head
        qh = q[q_tok, h, :hd].astype(np.float64)
        gate = q[q_tok, h, hd:].astype(np.float64)
        kh = kd[:, kvh * hd:(kvh + 1) * hd]
        vh = vd[:, kvh * hd:(kvh + 1) * hd]
        logits = kh @ qh / math.sqrt(hd)
        p = np.exp(logits - logits.max())
        want_out[h] = (p @ vh) / p.sum() * sigmoid(gate)
        max_sc = np.max(np.abs(logits)) * math.log2(math.e)
        for iwg in range(n_wg):
            m, s, o = attention_partials_reference(qh, kh, vh, scale_log2, n_wg, iwg)
            gm, gs, go = got_part[h, iwg, 0], got_part[h, iwg, 1], got_part[h, iwg, 2:]
            where = f"partial head={h} worker={iwg}"
            if m == -np.inf:
                assert gm == -np.inf and gs == 0.0 and np.all(go == 0.0), f"{where}: not empty"
                continue
            assert abs(gm - m) <= TOL_F32 * max_sc + 1e-6, f"{where}: m {gm} != {m}"
            assert abs(gs - s) <= TOL_ATTN * s, f"{where}: s {gs} != {s}"
            ref.assert_close(go, o, TOL_ATTN, f"{where}: o")
        ref.assert_untouched(got_part[h, n_wg:], f"partials past n_wg (head {h})")
    ref.assert_close(got_out[out_off:out_off + n_heads * hd], want_out.reshape(-1), TOL_ATTN,
                     "attention output")
    ref.assert_untouched(got_out[:out_off], "output before out_off")
    ref.assert_untouched(got_out[out_off + n_heads * hd:], "output past the heads")


# ---------------------------------------------------------------------------
# Attention: prefill staging (attn_kv_stage, attn_q_stage, attn_o_scatter)

ATTN_GEMM_FMT = "<9If"  # AttnGemmParams: 9 x uint, then float scale


@pytest.mark.parametrize("n_kv,head,kl,spare", [(1, 0, 1, 31), (2, 1, 33, 31), (4, 3, 40, 24)])
def test_attn_kv_stage(device, seed_lib, n_kv, head, kl, spare):
    """One kv head of the q8 cache dequantized to half: K rows [t][256], V transposed [d][kl_pad]."""
    hd = HEAD_DIM
    kv_row = n_kv * hd
    kl_pad = kl + spare
    max_t = kl_pad + 2
    rng = seeded("kv_stage", n_kv, head, kl)
    kc, scale_off = new_q8_cache(device, max_t, kv_row)
    vc, _ = new_q8_cache(device, max_t, kv_row)
    kv_append(device, seed_lib, kv_rows(rng, kl, kv_row), kv_rows(rng, kl, kv_row), kc, vc, 0, scale_off)
    kh = nan_f16(device, kl_pad + 1, hd)  # one spare row: must stay NaN
    vt = nan_f16(device, hd * kl_pad + 16)  # [256][kl_pad], then a spare tail
    params = struct.pack(ATTN_GEMM_FMT, kv_row, kv_row // 32, head, kl, kl_pad, scale_off, 0, kl, 1, 1.0)
    seed_lib.kernel("attn_kv_stage").dispatch_threads(
        {0: kc, 1: vc, 2: kh, 3: vt, 4: params}, grid=(kl_pad * hd,), threads=(256,))
    got_k = kh.numpy(np.float16, (kl_pad + 1, hd)).astype(np.float64)
    got_vt = vt.numpy(np.float16, (hd * kl_pad + 16,)).astype(np.float64)
    ref.assert_untouched(got_k[kl_pad:], "staged K past kl_pad")
    ref.assert_untouched(got_vt[hd * kl_pad:], "staged V past [256][kl_pad]")
    cols = slice(head * hd, (head + 1) * hd)
    for name, cache, got in (("K", kc, got_k[:kl_pad]), ("V", vc, got_vt[:hd * kl_pad].reshape(hd, kl_pad).T)):
        q, d = read_q8_cache(cache, max_t, kv_row)
        want = q[:kl, cols].astype(np.float64) * np.repeat(d[:kl].astype(np.float64), 32, axis=1)[:, cols]
        # int8 * f16 is exact in f32; one rounding to half.
        ref.assert_within(got[:kl], want, U16 * np.abs(want) + 2.0**-25, f"staged {name}")
        assert np.all(got[kl:] == 0.0), f"staged {name}: positions past kl are not zeroed"


@pytest.mark.parametrize("n_heads,nb", [(1, 1), (3, 7), (24, 2)])
def test_attn_q_stage(device, seed_lib, n_heads, nb):
    """qh[(head*nb + t)][256] = half(query * scale) from qg [t][head][query | gate]."""
    hd = HEAD_DIM
    rng = seeded("q_stage", n_heads, nb)
    qg = rng.standard_normal((nb, n_heads, 2 * hd)).astype(np.float32) * 2
    scale = 1.0 / math.sqrt(hd)
    qh = nan_f16(device, n_heads * nb + 1, hd)
    params = struct.pack(ATTN_GEMM_FMT, 1024, 32, 0, nb, 32, 0, 0, nb, n_heads, scale)
    seed_lib.kernel("attn_q_stage").dispatch_threads(
        {0: device.buffer(qg), 1: qh, 2: params, 3: u32(n_heads)}, grid=(n_heads * nb * hd,), threads=(256,))
    got = qh.numpy(np.float16, (n_heads * nb + 1, hd)).astype(np.float64)
    want = (qg[..., :hd].astype(np.float64) * scale).transpose(1, 0, 2).reshape(n_heads * nb, hd)
    # One f32 product then one rounding to half.
    ref.assert_within(got[:-1], want, (U16 + 2 * U32) * np.abs(want) + 2.0**-25, "staged q")
    ref.assert_untouched(got[-1:], "staged q past the heads")


@pytest.mark.parametrize("n_kv,n_rep,head,nb", [(1, 1, 0, 1), (2, 3, 1, 7), (4, 6, 2, 2)])
def test_attn_o_scatter(device, seed_lib, n_kv, n_rep, head, nb):
    """attn_out[t][(head*n_rep + r)*256 + d] = O[(r*nb + t)][d] * sigmoid(gate); other heads untouched."""
    hd = HEAD_DIM
    n_heads = n_kv * n_rep
    rng = seeded("o_scatter", n_kv, n_rep, head, nb)
    o = rng.standard_normal((n_rep * nb, hd)).astype(np.float32)
    qg = rng.standard_normal((nb, n_heads, 2 * hd)).astype(np.float32) * 2
    out = nan_f32(device, nb, n_heads, hd)
    params = struct.pack(ATTN_GEMM_FMT, n_kv * hd, n_kv * hd // 32, head, nb, 32, 0, 0, nb, n_rep, 1.0)
    seed_lib.kernel("attn_o_scatter").dispatch_threads(
        {0: device.buffer(o), 1: device.buffer(qg), 2: out, 3: params, 4: u32(n_heads)},
        grid=(n_rep * nb * hd,), threads=(256,))
    got = out.numpy(np.float32, (nb, n_heads, hd))
    mine = slice(head * n_rep, (head + 1) * n_rep)
    want = o.astype(np.float64).reshape(n_rep, nb, hd).transpose(1, 0, 2) * sigmoid(
        qg[:, mine, hd:].astype(np.float64))
    ref.assert_within(got[:, mine], want, TOL_FAST * np.abs(want) + 1e-30, "gated output")
    others = np.ones(n_heads, dtype=bool)
    others[mine] = False
    ref.assert_untouched(got[:, others], "heads of other kv groups")


# ---------------------------------------------------------------------------
# DeltaNet: conv_b, delta_norms, delta_gates, delta_scan2

DELTA_PREP_FMT = "<4If2I"  # DeltaPrepParams: n_k n_v d_k d_v, eps, nb snap_after


def conv_reference(x, w, hist):
    """Causal depthwise conv (w[:, K-1] multiplies the current token) then silu.

    x [nb][C], w [C][4], hist [C][3] (oldest first). Returns (y, |terms| sums,
    the padded sequence [3 + nb][C]).
    """
    seq = np.concatenate([hist.T, x], axis=0).astype(np.float64)
    nb = x.shape[0]
    acc = np.zeros_like(x, dtype=np.float64)
    mag = np.zeros_like(acc)
    for j in range(4):
        acc += w[:, j] * seq[j:j + nb]
        mag += np.abs(w[:, j] * seq[j:j + nb])
    return silu(acc), mag, seq


@pytest.mark.parametrize("channels,nb,snap_after,style", [
    (1, 1, 0, "grid"),
    (7, 3, 2, "groups"),
    (33, 7, 7, "grid"),
    (100, 33, 5, "groups"),
    (10240, 3, 2, "grid"),  # 27B conv channels
])
def test_conv_b(device, seed_lib, channels, nb, snap_after, style):
    rng = seeded("conv", channels, nb)
    x = rng.standard_normal((nb, channels)).astype(np.float32)
    w_bits = ref.bf16_bits((rng.standard_normal((channels, 4)) * 0.4).astype(np.float32))
    w = ref.bf16_to_f32(w_bits).astype(np.float64)
    hist = rng.standard_normal((channels, 3)).astype(np.float32)
    planes = max(snap_after, 1) + 1
    qkv = device.buffer(x)
    hbuf = device.buffer(hist)
    mid = nan_f32(device, planes, channels, 3)
    args = {0: qkv, 1: device.buffer(w_bits), 2: hbuf, 3: u32(channels, 4), 4: u32(nb), 5: u32(snap_after),
            6: mid}
    kernel = seed_lib.kernel("conv_b")
    if style == "grid":
        kernel.dispatch_threads(args, grid=(channels,), threads=(64,))
    else:
        kernel.dispatch(args, threadgroups=(cdiv(channels, 32) + 1,), threads=(32,))
    want, mag, seq = conv_reference(x, w, hist)
    got = qkv.numpy(np.float32, (nb, channels))
    # 4-term f32 sum (gamma_4 of the magnitudes) and a fast-math exp in silu.
    ref.assert_within(got, want, TOL_FAST * (mag + np.abs(want)) + 1e-30, "conv output")
    # History and snapshots are copies of raw inputs: exact.
    assert np.array_equal(hbuf.numpy(np.float32, (channels, 3)), seq[nb:nb + 3].T.astype(np.float32)), \
        "conv history is not the last 3 raw inputs"
    got_mid = mid.numpy(np.float32, (planes, channels, 3))
    for b in range(snap_after):
        assert np.array_equal(got_mid[b], seq[b + 1:b + 4].T.astype(np.float32)), f"snapshot {b}"
    ref.assert_untouched(got_mid[snap_after:], "snapshot planes past snap_after")


def delta_params(n_k, n_v, d_v, nb, snap_after=0, eps=1e-6):
    return struct.pack(DELTA_PREP_FMT, n_k, n_v, D_K, d_v, eps, nb, snap_after)


def l2_norm_reference(x, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


@pytest.mark.parametrize("n_k,n_v,d_v,nb,spt", [
    (1, 1, 64, 1, 1),
    (2, 6, 64, 3, 4),
    (4, 8, 96, 7, 2),
    (16, 48, 128, 2, 4),  # 27B
])
def test_delta_norms(device, seed_lib, n_k, n_v, d_v, nb, spt):
    """kqn[b] = [k heads / ||k|| | q heads / ||q|| / sqrt(d_k)] from qkv[b] = [q | k | v]."""
    rng = seeded("delta_norms", n_k, n_v, nb)
    qk = n_k * D_K
    conv_dim = 2 * qk + n_v * d_v
    qkv = silu(rng.standard_normal((nb, conv_dim)) * 1.5).astype(np.float32)
    qkv[0, :D_K] = 0.0  # a zero q head: eps keeps it finite (0)
    eps = 1e-6
    kqn = nan_f32(device, nb + 1, 2 * qk)
    seed_lib.kernel("delta_norms").dispatch(
        {0: device.buffer(qkv), 1: kqn, 2: delta_params(n_k, n_v, d_v, nb, eps=eps)},
        threadgroups=(cdiv(nb * n_k, spt),), threads=(32 * spt,))
    got = kqn.numpy(np.float32, (nb + 1, 2 * qk))
    q = qkv[:, :qk].reshape(nb, n_k, D_K)
    k = qkv[:, qk:2 * qk].reshape(nb, n_k, D_K)
    want = np.concatenate([l2_norm_reference(k, eps).reshape(nb, qk),
                           (l2_norm_reference(q, eps) / math.sqrt(D_K)).reshape(nb, qk)], axis=1)
    # 128-term f32 sums of squares, rsqrt within 2 ulp.
    ref.assert_within(got[:nb], want, TOL_F32 * np.abs(want) + 1e-30, "kqn")
    ref.assert_untouched(got[nb:], "kqn past nb")


@pytest.mark.parametrize("n_v,nb", [(1, 1), (7, 3), (33, 2), (48, 33)])
def test_delta_gates(device, seed_lib, n_v, nb):
    """gb[b][h] = (decay, beta): decay = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b)."""
    rng = seeded("delta_gates", n_v, nb)
    a = (rng.standard_normal((nb, n_v)) * 2.0).astype(np.float32)
    bb = (rng.standard_normal((nb, n_v)) * 3.0).astype(np.float32)
    a_log = rng.uniform(-1.0, 2.5, n_v).astype(np.float32)
    dt = rng.uniform(-3.0, 1.0, n_v).astype(np.float32)
    a = np.minimum(a, 3.0 - dt)  # keeps exp(A) * softplus below ~50, decay far from f32 underflow
    a_log[0] = -4.0
    a[0, 0] = 25.0 - dt[0]  # softplus past its linear threshold (20)
    a_log_bits, dt_bits = ref.bf16_bits(a_log), ref.bf16_bits(dt)
    gb = nan_f32(device, nb + 1, n_v, 2)
    seed_lib.kernel("delta_gates").dispatch_threads(
        {0: device.buffer(a), 1: device.buffer(bb), 2: device.buffer(a_log_bits), 3: device.buffer(dt_bits),
         4: gb, 5: delta_params(1, n_v, 128, nb)},
        grid=(nb * n_v,), threads=(64,))
    got = gb.numpy(np.float32, (nb + 1, n_v, 2))
    av = a.astype(np.float64) + ref.bf16_to_f32(dt_bits).astype(np.float64)
    rate = np.exp(ref.bf16_to_f32(a_log_bits).astype(np.float64)) * np.logaddexp(0.0, av)
    beta = sigmoid(bb.astype(np.float64))
    decay = got[:nb, :, 0].astype(np.float64)
    assert np.all((decay > 0) & (decay <= 1)), "decay outside (0, 1]"
    # Compare the exponent: f32 exp/log (fast math: a few ulp, log 2^-21 absolute)
    # leave decay's log off by TOL_FAST relative plus 1e-5 absolute.
    ref.assert_within(-np.log(decay), rate, TOL_FAST * rate + 1e-5, "decay exponent")
    ref.assert_within(got[:nb, :, 1], beta, TOL_FAST * beta, "beta")
    ref.assert_untouched(got[nb:], "gb past nb")


def delta_scan_reference(state, k, q, v, decay, beta, n_k, snap_after):
    """The recurrence of docs/design.md ("Gated DeltaNet"), state [h][dv][dk]: S *= decay; S += ((v - S k) beta) outer k; y = S q.

    k, q [nb][n_k][dk]; v [nb][n_v][dv]; decay, beta [nb][n_v]. v-head h reads k-head
    h // (n_v / n_k). Returns (y [nb][n_v][dv], final state, snapshots after rows < snap_after).
    """
    s = state.astype(np.float64).copy()
    nb, n_v = decay.shape
    group = n_v // n_k
    ys, snaps = [], []
    for b in range(nb):
        y = np.empty((n_v, s.shape[1]))
        for h in range(n_v):
            kk = k[b, h // group].astype(np.float64)
            qq = q[b, h // group].astype(np.float64)
            s[h] *= decay[b, h]
            kv = s[h] @ kk
            s[h] += np.outer((v[b, h] - kv) * beta[b, h], kk)
            y[h] = s[h] @ qq
        ys.append(y)
        if b < snap_after:
            snaps.append(s.copy())
    return np.array(ys), s, snaps


@pytest.mark.parametrize("n_k,n_v,d_v,nb,snap_after,spt", [
    (1, 1, 32, 1, 0, 1),
    (2, 6, 64, 3, 2, 4),
    (2, 4, 48, 7, 7, 2),
    (1, 3, 16, 33, 1, 8),
    (4, 4, 128, 32, 0, 4),
    (16, 48, 128, 2, 1, 4),  # 27B
])
def test_delta_scan2(device, seed_lib, n_k, n_v, d_v, nb, snap_after, spt):
    rng = seeded("delta_scan", n_k, n_v, d_v, nb)
    qk = n_k * D_K
    conv_dim = 2 * qk + n_v * d_v
    # The scan reads only v from qkv (q/k come normalized in kqn): NaN elsewhere proves it.
    qkv = np.full((nb, conv_dim), np.nan, dtype=np.float32)
    v = rng.standard_normal((nb, n_v, d_v)).astype(np.float32)
    qkv[:, 2 * qk:] = v.reshape(nb, -1)
    k = l2_norm_reference(rng.standard_normal((nb, n_k, D_K)), 0.0).astype(np.float32)
    q = (l2_norm_reference(rng.standard_normal((nb, n_k, D_K)), 0.0) / math.sqrt(D_K)).astype(np.float32)
    kqn = np.concatenate([k.reshape(nb, qk), q.reshape(nb, qk)], axis=1)
    decay = rng.uniform(0.3, 1.0, (nb, n_v)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (nb, n_v)).astype(np.float32)
    gb = np.stack([decay, beta], axis=-1)
    state0 = (rng.standard_normal((n_v, d_v, D_K)) * 0.3).astype(np.float32)
    planes = max(snap_after, 1) + 1
    sbuf = device.buffer(state0)
    y = nan_f32(device, nb + 1, n_v * d_v)
    mid = nan_f32(device, planes, n_v, d_v, D_K)
    seed_lib.kernel("delta_scan2").dispatch(
        {0: device.buffer(qkv), 1: device.buffer(kqn), 2: device.buffer(gb), 3: sbuf, 4: y, 5: mid,
         6: delta_params(n_k, n_v, d_v, nb, snap_after)},
        threadgroups=(cdiv(n_v * d_v, spt),), threads=(32 * spt,))
    want_y, want_s, want_snaps = delta_scan_reference(state0, k, q, v, decay, beta, n_k, snap_after)
    got_y = y.numpy(np.float32, (nb + 1, n_v * d_v))
    ref.assert_close(got_y[:nb], want_y.reshape(nb, -1), TOL_F32, "scan readout y")
    ref.assert_untouched(got_y[nb:], "y past nb")
    ref.assert_close(sbuf.numpy(np.float32, (n_v, d_v, D_K)), want_s, TOL_F32, "final state")
    got_mid = mid.numpy(np.float32, (planes, n_v, d_v, D_K))
    for b, snap in enumerate(want_snaps):
        ref.assert_close(got_mid[b], snap, TOL_F32, f"snapshot after row {b}")
    ref.assert_untouched(got_mid[snap_after:], "snapshot planes past snap_after")


def test_deltanet_chain(device, seed_lib):
    """conv_b -> delta_norms -> delta_gates -> delta_scan2 against docs/design.md's math from raw inputs."""
    n_k, n_v, d_v, nb = 2, 4, 32, 5
    qk = n_k * D_K
    channels = 2 * qk + n_v * d_v
    rng = seeded("deltanet_chain")
    x = rng.standard_normal((nb, channels)).astype(np.float32)
    w_bits = ref.bf16_bits((rng.standard_normal((channels, 4)) * 0.4).astype(np.float32))
    hist = rng.standard_normal((channels, 3)).astype(np.float32)
    a = rng.standard_normal((nb, n_v)).astype(np.float32)
    bb = rng.standard_normal((nb, n_v)).astype(np.float32)
    a_log_bits = ref.bf16_bits(rng.uniform(0.0, 2.0, n_v).astype(np.float32))
    dt_bits = ref.bf16_bits(rng.uniform(-2.0, 0.5, n_v).astype(np.float32))
    state0 = (rng.standard_normal((n_v, d_v, D_K)) * 0.3).astype(np.float32)

    qkv = device.buffer(x)
    seed_lib.kernel("conv_b").dispatch_threads(
        {0: qkv, 1: device.buffer(w_bits), 2: device.buffer(hist), 3: u32(channels, 4), 4: u32(nb),
         5: u32(0), 6: nan_f32(device, 1)}, grid=(channels,), threads=(64,))
    kqn = nan_f32(device, nb, 2 * qk)
    params = delta_params(n_k, n_v, d_v, nb)
    seed_lib.kernel("delta_norms").dispatch(
        {0: qkv, 1: kqn, 2: params}, threadgroups=(cdiv(nb * n_k, 4),), threads=(128,))
    gb = nan_f32(device, nb, n_v, 2)
    seed_lib.kernel("delta_gates").dispatch_threads(
        {0: device.buffer(a), 1: device.buffer(bb), 2: device.buffer(a_log_bits), 3: device.buffer(dt_bits),
         4: gb, 5: params}, grid=(nb * n_v,), threads=(32,))
    sbuf = device.buffer(state0)
    y = nan_f32(device, nb, n_v * d_v)
    seed_lib.kernel("delta_scan2").dispatch(
        {0: qkv, 1: kqn, 2: gb, 3: sbuf, 4: y, 5: nan_f32(device, 1), 6: params},
        threadgroups=(cdiv(n_v * d_v, 4),), threads=(128,))

    conv, _, _ = conv_reference(x, ref.bf16_to_f32(w_bits).astype(np.float64), hist)
    q = l2_norm_reference(conv[:, :qk].reshape(nb, n_k, D_K), 1e-6) / math.sqrt(D_K)
    k = l2_norm_reference(conv[:, qk:2 * qk].reshape(nb, n_k, D_K), 1e-6)
    v = conv[:, 2 * qk:].reshape(nb, n_v, d_v)
    av = a.astype(np.float64) + ref.bf16_to_f32(dt_bits)
    decay = np.exp(-np.exp(ref.bf16_to_f32(a_log_bits).astype(np.float64)) * np.logaddexp(0.0, av))
    beta = sigmoid(bb.astype(np.float64))
    want_y, want_s, _ = delta_scan_reference(state0, k, q, v, decay, beta, n_k, 0)
    # Fast-math silu/gates feed the recurrence: TOL_FAST per stage, 5 stages.
    ref.assert_close(y.numpy(np.float32, (nb, n_v * d_v)), want_y.reshape(nb, -1), 5 * TOL_FAST, "chain y")
    ref.assert_close(sbuf.numpy(np.float32, (n_v, d_v, D_K)), want_s, 5 * TOL_FAST, "chain state")


# ---------------------------------------------------------------------------
# Elementwise: silu_mul, add_inplace, copy_f32

ELEMENTWISE_SIZES = [1, 7, 33, 1000, 17408]  # 17408: the 27B MLP width


@pytest.mark.parametrize("n", ELEMENTWISE_SIZES)
def test_silu_mul(device, seed_lib, n):
    """y = silu(a) * b. No bounds guard: dispatched over exactly n threads."""
    rng = seeded("silu_mul", n)
    a = np.clip(rng.standard_normal(n + 32) * 4.0, -12.0, 12.0).astype(np.float32)
    b = rng.standard_normal(n + 32).astype(np.float32)
    y = nan_f32(device, n + 32)
    seed_lib.kernel("silu_mul").dispatch_threads(
        {0: device.buffer(a), 1: device.buffer(b), 2: y}, grid=(n,), threads=(256,))
    got = y.numpy(np.float32, (n + 32,))
    want = silu(a[:n].astype(np.float64)) * b[:n]
    ref.assert_within(got[:n], want, TOL_FAST * np.abs(want) + 1e-30, "silu_mul")
    ref.assert_untouched(got[n:], "silu_mul past n")


@pytest.mark.parametrize("n", ELEMENTWISE_SIZES)
def test_add_inplace(device, seed_lib, n):
    """x += r over exactly n threads; the tail of x (r = NaN there) must not change."""
    rng = seeded("add_inplace", n)
    x = rng.standard_normal(n + 32).astype(np.float32)
    r = rng.standard_normal(n + 32).astype(np.float32)
    r[n:] = np.nan
    xbuf = device.buffer(x)
    seed_lib.kernel("add_inplace").dispatch_threads({0: xbuf, 1: device.buffer(r)}, grid=(n,), threads=(256,))
    got = xbuf.numpy(np.float32, (n + 32,))
    exact = x[:n].astype(np.float64) + r[:n]
    # One correctly rounded f32 addition.
    ref.assert_within(got[:n], exact, U32 * np.abs(exact), "add_inplace")
    assert np.array_equal(got[n:], x[n:]), "add_inplace changed x past n"


@pytest.mark.parametrize("n,src_off", [(1, 0), (7, 5), (33, 0), (1000, 1), (17408, 0)])
def test_copy_f32(device, seed_lib, n, src_off):
    """dst[:n] = src[:n]; guarded, so more threads than n are dispatched.

    src_off > 0 binds the source as (buffer, byte offset), as the engine binds views.
    """
    rng = seeded("copy", n)
    src = rng.standard_normal(src_off + n + 40).astype(np.float32)
    dst = nan_f32(device, n + 40)
    src_arg = (device.buffer(src), 4 * src_off) if src_off else device.buffer(src)
    seed_lib.kernel("copy_f32").dispatch(
        {0: src_arg, 1: dst, 2: u32(n)}, threadgroups=(cdiv(n + 40, 64),), threads=(64,))
    got = dst.numpy(np.float32, (n + 40,))
    assert np.array_equal(got[:n], src[src_off:src_off + n]), "copy_f32 is not an exact copy"
    ref.assert_untouched(got[n:], "copy_f32 past n")


# ---------------------------------------------------------------------------
# Sampling: argmax_partial + argmax_final, embed_rows

ARGPAIR_EMPTY = (0x7FC00000, 0xFFFFFFFF)  # (NaN, ~0): what a slot holds before it is written


def argmax_lowest(values):
    """(value, index) of the maximum, lowest index on ties; (-inf, 0) for no values."""
    if values.size == 0:
        return -np.inf, 0
    i = int(np.argmax(values))  # numpy returns the first occurrence
    return values[i], i


def tie_indices(n, groups, tpg):
    """Indices for a tied maximum whose lowest member is not handled first.

    The lowest sits in the last threadgroup (second simdgroup where there is one);
    the others sit in group 0, later in the same thread's stride, and in a lane
    below it, so ties must be broken by index rather than by group, lane or order.
    """
    grid = groups * tpg
    low = (groups - 1) * tpg + min(37, tpg - 1)
    if low >= n:
        low = n // 2
    cands = {low, low + 1, grid + 3, low + grid, low - 2 + 2 * grid, 2 * grid + 1, n - 1}
    return sorted(i for i in cands if low <= i < n)


ARGMAX_CASES = [
    # n, groups, threads per group, final threads, pattern
    (1, 1, 32, 32, "random"),
    (7, 2, 64, 32, "random"),  # group 1 sees no logits
    (33, 1, 32, 64, "ties"),
    (1000, 4, 64, 32, "ties"),  # ties across groups and stride rounds
    (1000, 3, 96, 96, "equal"),
    (4099, 5, 128, 64, "negative"),
    (248320, 64, 256, 64, "ties"),  # the 27B vocabulary
]


@pytest.mark.parametrize("n,groups,tpg,final_tpg,pattern", ARGMAX_CASES)
def test_argmax(device, seed_lib, n, groups, tpg, final_tpg, pattern):
    rng = seeded("argmax", n, groups, pattern)
    logits = (rng.standard_normal(n) * 3.0).astype(np.float32)
    if pattern == "ties":
        logits[tie_indices(n, groups, tpg)] = logits.max() + 1.5
    elif pattern == "equal":
        logits[:] = 0.75
    elif pattern == "negative":
        logits = -np.abs(logits) - 5.0
    parts = device.buffer(np.tile(np.array(ARGPAIR_EMPTY, dtype=np.uint32), groups + 1))
    seed_lib.kernel("argmax_partial").dispatch(
        {0: device.buffer(logits), 1: parts, 2: u32(n)}, threadgroups=(groups,), threads=(tpg,))
    step = 3
    ids = device.buffer(np.full(step + 4, 0xDEADBEEF, dtype=np.uint32))
    seed_lib.kernel("argmax_final").dispatch(
        {0: parts, 1: ids, 2: u32(groups), 3: u32(step)}, threadgroups=(1,), threads=(final_tpg,))

    # Thread t = g*tpg + l of the grid reads logits t, t + grid, t + 2*grid, ...
    got_parts = parts.numpy(np.uint32, (groups + 1, 2))
    owner = (np.arange(n) % (groups * tpg)) // tpg
    for g in range(groups):
        idx = np.nonzero(owner == g)[0]
        v, i = argmax_lowest(logits[idx])
        want_i = int(idx[i]) if idx.size else 0
        got_v = got_parts[g, :1].view(np.float32)[0]
        assert (got_v, int(got_parts[g, 1])) == (np.float32(v), want_i), \
            f"partial {g}: got ({got_v}, {got_parts[g, 1]}), want ({v}, {want_i})"
    assert tuple(got_parts[groups]) == ARGPAIR_EMPTY, "argmax_partial wrote past its threadgroups"
    got_ids = ids.numpy(np.uint32, (step + 4,))
    want = int(np.argmax(logits))
    assert got_ids[step + 1] == want, f"winner {got_ids[step + 1]}, want {want} (lowest index on ties)"
    others = np.delete(got_ids, step + 1)
    assert np.all(others == 0xDEADBEEF), "argmax_final wrote outside ids[step + 1]"


@pytest.mark.parametrize("hsize,vocab,nb,i0", [
    (64, 5, 1, 0),
    (192, 3, 33, 1),
    (1024, 37, 7, 3),
    (5120, 12, 3, 5),  # 27B hidden; a small vocabulary slice
])
def test_embed_rows(device, seed_lib, hsize, vocab, nb, i0):
    """hidden[b] = dequantized embedding row ids[i0 + b] (4-bit, group 64)."""
    rng = seeded("embed", hsize, vocab, nb)
    words, sb, bb, table = quantized_weights(rng, vocab, hsize)
    ids = rng.integers(0, vocab, i0 + nb + 2).astype(np.uint32)
    ids[i0] = vocab - 1  # the last row of the table
    hidden = nan_f32(device, nb + 1, hsize)
    seed_lib.kernel("embed_rows").dispatch(
        {0: device.buffer(ids), 1: device.buffer(words), 2: device.buffer(sb), 3: device.buffer(bb),
         4: hidden, 5: u32(hsize), 6: u32(i0), 7: u32(nb)},
        threadgroups=(cdiv(nb * hsize, 256),), threads=(256,))
    got = hidden.numpy(np.float32, (nb + 1, hsize))
    rows = ids[i0:i0 + nb]
    want = table[rows]
    # scale*q + bias: one rounding when fused, at most two otherwise.
    scale = np.repeat(np.abs(ref.bf16_to_f32(sb)), GROUP, axis=1)[rows]
    bias = np.repeat(np.abs(ref.bf16_to_f32(bb)), GROUP, axis=1)[rows]
    ref.assert_within(got[:nb], want, 2 * U32 * (15 * scale + bias), "embedding rows")
    ref.assert_untouched(got[nb:], "hidden past nb")
