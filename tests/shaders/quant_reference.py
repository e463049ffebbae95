"""Numpy side of the quant.metal tests: mirrors of shaders/params/quant.h, test data
generators and float64 references written from the formats' definitions (MLX affine
quantization: w = scale * q + bias per group; mxfp4/nvfp4/mxfp8: w = scale * value(code);
unquantized floats; y = W x), never from the kernels. Quantized test weights come from
mlx's own ``mx.quantize``, so the packing the kernels read is mlx's.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ..support import reference as ref
from .params import header_constants

VARIANTS = [(bits, group) for bits in (2, 3, 4, 5, 6, 8) for group in (32, 64, 128)]
# Every weight format: the kernels' host-name suffix.
FORMATS = ([f"b{bits}_g{group}" for bits, group in VARIANTS] + [f"b{bits}_g64_sf32" for bits in (2, 3, 4, 5, 6, 8)]
           + ["mxfp4", "nvfp4", "mxfp8", "bf16", "f16", "f32"])


C = header_constants("quant")
QMV_ROWS_PER_TG = C["MQ_QMV_ROWS_PER_THREADGROUP"]  # moe_qmv's (fixed R)
QMV_SIMDGROUPS = C["MQ_QMV_SIMDGROUPS"]
# Rows per SIMD-group of the decode/verify matvec variants (host names <op>_r<R>_<format>).
QMV_R = (2, 4, 8)
QMV_THREADS = C["MQ_QMV_THREADS"]
QMV_SMALL_ROWS = C["MQ_QMV_SMALL_ROWS"]  # rows of the *_rows kernels (R = 2, 4, 8)
QMV_MAX_ROWS = C["MQ_QMV_MAX_ROWS"]  # rows of the deep tier, *_deep_r<QMV_DEEP_R>
QMV_DEEP_R = C["MQ_QMV_DEEP_R"]
QMM_TILE_ROWS = C["MQ_QMM_TILE_ROWS"]
QMM_TILE_OUT = C["MQ_QMM_TILE_OUT"]
QMM_THREADS = C["MQ_QMM_THREADS"]
EMBED_THREADS = C["MQ_EMBED_THREADS"]
QUANT_BLOCK = C["MQ_QUANT_BLOCK"]

# struct QuantMatmulParams { uint in_dim, out_dim, rows, x_stride, y_stride; }
# struct QuantEmbedParams  { uint dim, vocab, first, rows; }


def matmul_params(in_dim, out_dim, rows=1, x_stride=None, y_stride=None) -> np.ndarray:
    return np.array([in_dim, out_dim, rows, in_dim if x_stride is None else x_stride,
                     out_dim if y_stride is None else y_stride], dtype=np.uint32)


def embed_params(dim, vocab, first, rows) -> np.ndarray:
    return np.array([dim, vocab, first, rows], dtype=np.uint32)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# Tolerances

U32 = 2.0**-24  # f32 unit roundoff


def tol_f32_dot(n: int) -> float:
    """Error bound of an n-term f32 dot product, relative to the typical output size.

    Rounding errors random-walk to about u*sqrt(n) of the typical output. The affine
    split s*sum(q x) + b*sum(x) rounds intermediate terms up to a few times larger
    than a group's share of the output (q reaches 2^bits - 1, b sits on the group's
    extreme), which costs a small constant factor; 16x covers that and any summation
    order. A half-precision path (~1e-3) or one misplaced element (~1/sqrt(n) of the
    output, >= 7e-3 for n <= 17408) fails by an order of magnitude or more.
    """
    return 16 * U32 * math.sqrt(n)


# ---------------------------------------------------------------------------
# Data


def seeded(*key) -> np.random.Generator:
    """A generator whose seed depends only on the test case (stable across runs)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def activations(rng, rows: int, n: int) -> np.ndarray:
    """Hidden-state-like rows: N(0, 1) with a few large channels shared by all rows."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    cols = rng.choice(n, size=min(4, n), replace=False)
    x[:, cols] *= 20.0
    return x


def random_quantized(rng, out_dim: int, in_dim: int, bits: int, group: int):
    """Uniform random codes with scales/biases shaped like a checkpoint's, without
    quantizing a float matrix (cheap at 27B sizes). Returns (words, scale bits, bias bits)."""
    words = rng.integers(0, 2**32, size=(out_dim, in_dim * bits // 32), dtype=np.uint32)
    n_bins = 2**bits - 1
    span = 0.1 * rng.uniform(0.5, 2.0, (out_dim, in_dim // group))  # group max - min
    sign = np.where(rng.random(span.shape) < 0.5, -1.0, 1.0)
    scale = sign * span / n_bins
    bias = -scale * n_bins * rng.uniform(0.3, 0.7, span.shape)  # groups roughly centred on 0
    return words, ref.bf16_bits(scale.astype(np.float32)), ref.bf16_bits(bias.astype(np.float32))


# ---------------------------------------------------------------------------
# References (float64)


def matmul_ref(value, x):
    """Y = X W^T in float64 from the dequantized weights [out, in], and the typical output
    size (the tolerance's scale)."""
    w = np.asarray(value, dtype=np.float64)
    x64 = np.atleast_2d(np.asarray(x, dtype=np.float64))
    typical = math.sqrt(float(np.mean(w * w))) * math.sqrt(float(np.mean(np.sum(x64 * x64, axis=-1))))
    return x64 @ w.T, typical


# ---------------------------------------------------------------------------
# Weights of every format, quantized by mlx


def affine_format(fmt: str):
    """(bits, group) of an affine suffix "b<bits>_g<group>[_sf32]", else None."""
    if not fmt.startswith("b") or "_g" not in fmt:
        return None
    bits, group = fmt[1:].removesuffix("_sf32").split("_g")
    return int(bits), int(group)


def format_weights(rng, fmt: str, out_dim: int, in_dim: int):
    """Gaussian rows of different magnitude in format ``fmt``, quantized by ``mx.quantize``.

    Returns (words uint32 [out, ...], scales or None, biases or None, dequantized f32 [out, in]):
    affine scales/biases as bf16 bit patterns (float32 for the *_sf32 formats), fp-mode scales
    uint8, floats without either;
    the dequantized weights are what the kernels must use (exactly: fma(scale, q, bias) for affine).
    """
    import mlx.core as mx

    w = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    w *= (0.02 * rng.uniform(0.5, 2.0, (out_dim, 1))).astype(np.float32)
    if fmt in ("bf16", "f16", "f32"):
        if fmt == "bf16":
            bits = ref.bf16_bits(w)
            value = ref.bf16_to_f32(bits)
        else:
            value = w.astype(np.float16 if fmt == "f16" else np.float32)
            bits = value
        return np.ascontiguousarray(bits).view(np.uint32), None, None, value.astype(np.float32)
    aff = affine_format(fmt)
    if aff is not None and fmt.endswith("_sf32"):
        bits, group = aff
        q, s, b = mx.quantize(mx.array(w), group_size=group, bits=bits, mode="affine")  # f32 scales
        words, s, b = np.array(q), np.array(s), np.array(b)
        codes = ref.unpack_bits(words, bits).astype(np.float64)
        value = codes * np.repeat(s.astype(np.float64), group, 1) + np.repeat(b.astype(np.float64), group, 1)
        return words, s, b, value.astype(np.float32)  # rounded once, as fma(scale, q, bias)
    if aff is not None:
        bits, group = aff
        q, s, b = mx.quantize(mx.array(w).astype(mx.bfloat16), group_size=group, bits=bits, mode="affine")
        words, sb, bb = np.array(q), np.array(s.view(mx.uint16)), np.array(b.view(mx.uint16))
        return words, sb, bb, ref.dequantize(words, sb, bb, group, bits)
    bits, group = ref.FP_MODES[fmt]
    q, s = mx.quantize(mx.array(w), group_size=group, bits=bits, mode=fmt)
    words, scales = np.array(q), np.array(s)
    return words, scales, None, ref.dequantize_fp(words, scales, fmt)
