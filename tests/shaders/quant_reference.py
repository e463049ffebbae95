"""Numpy side of the quant.metal tests: mirrors of shaders/params/quant.h, test data
generators and float64 references written from DESIGN.md section 2 (MLX affine
quantization: w = scale * q + bias per group; y = W x), never from the kernels.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from .. import reference as ref
from .params import header_constants

VARIANTS = [(bits, group) for bits in (4, 8) for group in (32, 64, 128)]


C = header_constants("quant")
QMV_ROWS_PER_TG = C["MQ_QMV_ROWS_PER_THREADGROUP"]
QMV_THREADS = C["MQ_QMV_THREADS"]
QMV_MAX_ROWS = C["MQ_QMV_MAX_ROWS"]
QMM_TILE_ROWS = C["MQ_QMM_TILE_ROWS"]
QMM_TILE_OUT = C["MQ_QMM_TILE_OUT"]
QMM_THREADS = C["MQ_QMM_THREADS"]
EMBED_THREADS = C["MQ_EMBED_THREADS"]

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


def quantized_weights(rng, out_dim: int, in_dim: int, bits: int, group: int):
    """Gaussian rows of different magnitude quantized the MLX way (both scale signs occur).

    Returns (words uint32 [out, in*bits/32], scale bits, bias bits, dequantized f32 [out, in]).
    """
    w = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    w *= (0.02 * rng.uniform(0.5, 2.0, (out_dim, 1))).astype(np.float32)
    words, sb, bb = ref.quantize(w, group, bits)
    return words, sb, bb, ref.dequantize(words, sb, bb, group, bits)


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


def matmul_ref(words, sb, bb, x, bits: int, group: int, chunk: int = 256):
    """Y = X W^T in float64 from the dequantized weights, `chunk` weight rows at a time.

    Also returns the typical output size (reference.typical_dot) for the tolerance.
    """
    x64 = np.atleast_2d(np.asarray(x, dtype=np.float64))
    out_dim = words.shape[0]
    y = np.empty((x64.shape[0], out_dim))
    sq = 0.0
    for r in range(0, out_dim, chunk):
        w = ref.dequantize(words[r:r + chunk], sb[r:r + chunk], bb[r:r + chunk], group, bits).astype(np.float64)
        y[:, r:r + chunk] = x64 @ w.T
        sq += float(np.sum(w * w))
    rms_w = math.sqrt(sq / (out_dim * x64.shape[1]))
    typical = rms_w * math.sqrt(float(np.mean(np.sum(x64 * x64, axis=-1))))
    return y, typical
