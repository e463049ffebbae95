"""Numpy references shared by the kernel tests.

Written from the formats' definitions (docs/design.md, "Quantized weights"), never from a kernel:
bf16 as the top half of a float32 rounded to nearest-even, MLX affine quantization
(`w = scale * q + bias`, element j of a uint32 word in bits `bits*j ..`, element 0
in the low bits), and the error measures the tests compare with.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------
# bf16 (stored as uint16 bit patterns: numpy has no bfloat16 dtype)


def bf16_bits(x) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest, ties to even.

    Overflow rounds to +-inf as IEEE rounding does; NaN stays a (quiet) NaN.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    rounded = ((u + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def bf16_to_f32(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x) -> np.ndarray:
    """x rounded to the nearest bf16 value, as float32."""
    return bf16_to_f32(bf16_bits(x))


def round_f16(x) -> np.ndarray:
    """x rounded to the nearest IEEE half (nearest-even), as float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------------------
# MLX affine quantization


def _check_bits(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must divide 32 evenly (2, 4 or 8), got {bits}")
    return 32 // bits


def pack_bits(q, bits: int) -> np.ndarray:
    """Integer codes [rows, n] in [0, 2**bits) -> uint32 words [rows, n*bits/32].

    Element j of a word occupies bits `bits*j .. bits*j + bits - 1`: element 0 is
    in the low bits.
    """
    per_word = _check_bits(bits)
    q = np.asarray(q)
    rows, n = q.shape
    if n % per_word:
        raise ValueError(f"row length {n} is not a multiple of {per_word}")
    if q.min() < 0 or q.max() >= (1 << bits):
        raise ValueError(f"codes out of range for {bits} bits")
    q = q.astype(np.uint64).reshape(rows, n // per_word, per_word)
    shifts = (bits * np.arange(per_word, dtype=np.uint64))
    return (q << shifts).sum(axis=-1).astype(np.uint32)


def unpack_bits(words, bits: int) -> np.ndarray:
    """uint32 words [rows, m] -> integer codes [rows, m*32/bits] (uint32).

    Each row is one little-endian bit stream: code j occupies stream bits
    bits*j .. bits*j + bits - 1, word 0's low bit first, so 3-, 5- and 6-bit codes
    straddle words."""
    w = np.ascontiguousarray(words, dtype="<u4")
    stream = np.unpackbits(w.view(np.uint8).reshape(*w.shape[:-1], -1), axis=-1, bitorder="little")
    n = w.shape[-1] * 32 // bits
    stream = stream[..., : n * bits].reshape(*w.shape[:-1], n, bits).astype(np.uint32)
    return (stream << np.arange(bits, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)


# ---------------------------------------------------------------------------
# microscaling FP formats (mlx modes mxfp4, nvfp4, mxfp8): w = scale * value(code)

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
FP_MODES = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}  # (bits, group)


def e4m3_values(codes) -> np.ndarray:
    """FP8 E4M3 ("fn": bias 7, no infinities, 0x7f/0xff NaN) -> float64."""
    c = np.asarray(codes, dtype=np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0**-9, (8 + m) * 2.0 ** (e - 10))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(c & 0x80, -v, v)


def e8m0_values(codes) -> np.ndarray:
    """E8M0 scales: 2^(c - 127), 255 NaN -> float64."""
    c = np.asarray(codes, dtype=np.float64)
    return np.where(c == 255, np.nan, 2.0 ** (c - 127))


def dequantize_fp(words, scales, mode: str) -> np.ndarray:
    """float32 [out, in] of an mxfp4 / nvfp4 / mxfp8 weight (scales uint8 [out, in/group]); exact."""
    bits, group = FP_MODES[mode]
    q = unpack_bits(words, bits)
    v = E2M1[q] if bits == 4 else e4m3_values(q)
    s = (e4m3_values if mode == "nvfp4" else e8m0_values)(np.asarray(scales, dtype=np.uint8))
    return (v * np.repeat(s, group, axis=-1)).astype(np.float32)


def quantize(w, group_size: int, bits: int):
    """MLX-format affine quantization of w [out, in] along `in`.

    Returns (words uint32 [out, in*bits/32], scales bf16 bits [out, in/group_size],
    biases bf16 bits [out, in/group_size]) with w ~= scale * q + bias.

    Each group's bias sits on its extreme of larger magnitude (so the largest
    weights keep full bf16 precision) and the scale points from it into the
    group, so the scale is negative when the group's maximum is the anchor:
    both signs of scale occur, as they do in real checkpoints.
    """
    _check_bits(bits)
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    if in_dim % group_size:
        raise ValueError(f"in_dim {in_dim} is not a multiple of group_size {group_size}")
    n_bins = (1 << bits) - 1
    g = w.reshape(out_dim, in_dim // group_size, group_size).astype(np.float64)
    lo = g.min(axis=-1)
    hi = g.max(axis=-1)
    anchor_hi = np.abs(hi) > np.abs(lo)
    bias = np.where(anchor_hi, hi, lo)
    scale = (hi - lo) / n_bins * np.where(anchor_hi, -1.0, 1.0)
    scale_bits = bf16_bits(scale.astype(np.float32))
    bias_bits = bf16_bits(bias.astype(np.float32))
    s = bf16_to_f32(scale_bits).astype(np.float64)[..., None]
    b = bf16_to_f32(bias_bits).astype(np.float64)[..., None]
    safe = np.where(s == 0.0, 1.0, s)
    q = np.where(s == 0.0, 0.0, np.rint((g - b) / safe))
    q = np.clip(q, 0, n_bins).astype(np.uint32).reshape(out_dim, in_dim)
    return pack_bits(q, bits), scale_bits, bias_bits


def dequantize(words, scales_bits, biases_bits, group_size: int, bits: int) -> np.ndarray:
    """Inverse of the MLX format: float32 [out, in] with w = scale * q + bias.

    Computed exactly in float64 and rounded once to float32, i.e. the value a
    fused multiply-add gives.
    """
    q = unpack_bits(words, bits).astype(np.float64)
    out_dim, in_dim = q.shape
    if in_dim % group_size:
        raise ValueError(f"in_dim {in_dim} is not a multiple of group_size {group_size}")
    s = np.repeat(bf16_to_f32(scales_bits).astype(np.float64), group_size, axis=-1)
    b = np.repeat(bf16_to_f32(biases_bits).astype(np.float64), group_size, axis=-1)
    if s.shape != q.shape:
        raise ValueError(f"scales cover {s.shape}, codes are {q.shape}")
    return (s * q + b).astype(np.float32)


# ---------------------------------------------------------------------------
# error measures


def rel_err(got, want) -> float:
    """Normwise relative error max|got - want| / max|want| (absolute if want == 0)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    denom = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    return err / denom if denom > 0 else err


def nmse(got, want) -> float:
    """Normalised mean squared error sum((got - want)^2) / sum(want^2)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    den = float(np.sum(want * want))
    num = float(np.sum((got - want) ** 2))
    return num / den if den > 0 else num


def assert_finite_like(got, want, what: str) -> None:
    """Fail at once when NaN/inf appear where the reference has none (or vice versa)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.isfinite(got) != np.isfinite(want)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} non-finite mismatches, first at {idx}: "
            f"got {got[idx]!r}, want {want[idx]!r}")


def assert_close(got, want, tol: float, what: str, scale: float | None = None) -> None:
    """NaN/inf pattern must match, then max|got - want| / scale <= tol.

    `scale` defaults to max|want| (normwise relative error). Dot-product outputs
    pass `typical_dot(...)` instead, so that a small output (one row that happens
    to cancel) is not judged against its own accidental size.
    """
    assert_finite_like(got, want, what)
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    fin = np.isfinite(want64)
    if not np.array_equal(got64[~fin], want64[~fin]):
        raise AssertionError(f"{what}: non-finite values differ")
    if not fin.any():
        return
    diff = np.abs(np.where(fin, got64, 0.0) - np.where(fin, want64, 0.0))
    denom = float(np.max(np.abs(want64[fin]))) if scale is None else float(scale)
    err = float(diff.max()) / denom if denom > 0 else float(diff.max())
    if not err <= tol:
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
        raise AssertionError(
            f"{what}: error {err:.3g} > {tol:.3g} (relative to {denom:.4g}); worst at "
            f"{idx}: got {got64[idx]!r}, want {want64[idx]!r}")


def typical_dot(w, x) -> float:
    """Typical size of y = x @ w.T: rms(w) times the rms over rows of ||x_b||.

    It is what |y| would be for uncorrelated signs; floating-point errors of a
    dot product scale with it, not with one output's accidental cancellation.
    """
    w = np.asarray(w, dtype=np.float64)
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    return float(np.sqrt(np.mean(w * w)) * np.sqrt(np.mean(np.sum(x * x, axis=-1))))


def assert_within(got, want, bound, what: str) -> None:
    """Elementwise |got - want| <= bound (bound broadcasts), NaN pattern first."""
    assert_finite_like(got, want, what)
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - want64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), diff.shape)
    fin = np.isfinite(want64)
    bad = fin & ~(diff <= bound)
    bad |= ~fin & (got64 != want64) & ~(np.isnan(got64) & np.isnan(want64))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {diff.size} elements out of bounds; first at "
            f"{idx}: got {got64[idx]!r}, want {want64[idx]!r}, bound {bound[idx]:.3g}")


def assert_untouched(region, what: str) -> None:
    """A region pre-filled with NaN must still be all NaN."""
    region = np.asarray(region)
    written = ~np.isnan(region)
    if written.any():
        idx = tuple(int(i) for i in np.argwhere(written)[0])
        raise AssertionError(
            f"{what}: {int(written.sum())} elements written outside the kernel's "
            f"output, first at {idx} = {region[idx]!r}")
