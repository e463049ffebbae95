"""Numpy side of the attention.metal tests: mirrors of shaders/params/attention.h, the
KV-cache formats, and float64 references of the gated attention (docs/design.md, "Full attention")
(per-head RMSNorm, half-split partial RoPE, causal GQA softmax(q k^T / sqrt(d)) v,
output times sigmoid(gate)), written from the math, never from the kernels.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from .params import MAX_SEGMENTS, header_constants


C = header_constants("attention")
HD = C["MQ_ATTN_HEAD_DIM"]
ROT = C["MQ_ATTN_ROT_DIM"]
Q8_BLOCK = C["MQ_ATTN_Q8_BLOCK"]
PREP_SIMDGROUPS = C["MQ_ATTN_PREP_SIMDGROUPS"]
COMBINE_THREADS = C["MQ_ATTN_COMBINE_THREADS"]
DECODE_THREADS = C["MQ_ATTN_DECODE_THREADS"]
PREFILL_MAX_SIMDGROUPS = C["MQ_ATTN_PREFILL_MAX_SIMDGROUPS"]

# struct AttnPrepParams { uint rows, nq, nkv, q_stride, k_stride, v_stride, pos_base, max_ctx; float eps;
#                         int rope_delta; uint has_rope_pos, mrope_h_end, mrope_w_end; }
PREP_PARAMS = np.dtype([(name, "<u4") for name in
                        ("rows", "nq", "nkv", "q_stride", "k_stride", "v_stride", "pos_base", "max_ctx")]
                       + [("eps", "<f4"), ("rope_delta", "<i4"), ("has_rope_pos", "<u4"), ("mrope_h_end", "<u4"),
                          ("mrope_w_end", "<u4")])
# The rotary fields' values for text rows at their cache positions (what text-only models use).
PREP_ROPE_DEFAULTS = dict(rope_delta=0, has_rope_pos=0, mrope_h_end=0, mrope_w_end=0)
# struct AttnParams { uint rows, nq, nkv, q_stride, out_stride, pos_base, max_ctx; }
ATTN_PARAMS = np.dtype([(name, "<u4") for name in
                        ("rows", "nq", "nkv", "q_stride", "out_stride", "pos_base", "max_ctx")])
# struct AttnDecodeParams { uint nq, nkv, q_stride, k_stride, v_stride, out_stride, max_ctx, cache_slot_bytes,
#                           n_splits, split_len[MQ_MAX_SEGMENTS]; float eps; int rope_delta[MQ_MAX_SEGMENTS]; }
DECODE_PARAMS = np.dtype([(name, "<u4") for name in
                          ("nq", "nkv", "q_stride", "k_stride", "v_stride", "out_stride", "max_ctx", "cache_slot_bytes",
                           "n_splits")] + [("split_len", "<u4", (MAX_SEGMENTS,)), ("eps", "<f4"),
                                           ("rope_delta", "<i4", (MAX_SEGMENTS,))])


def prep_params(**fields) -> np.ndarray:
    fields = {**PREP_ROPE_DEFAULTS, **fields}
    return np.array([tuple(fields[name] for name in PREP_PARAMS.names)], dtype=PREP_PARAMS)


def attn_params(**fields) -> np.ndarray:
    return np.array([tuple(fields[name] for name in ATTN_PARAMS.names)], dtype=ATTN_PARAMS)


def decode_params(**fields) -> np.ndarray:
    """AttnDecodeParams; split_len (and rope_delta, default all 0) a list with one entry per segment
    (the rest padded with 1, 0)."""
    lens = list(fields["split_len"])
    deltas = list(fields.get("rope_delta", []))
    fields = dict(fields, split_len=lens + [1] * (MAX_SEGMENTS - len(lens)),
                  rope_delta=deltas + [0] * (MAX_SEGMENTS - len(deltas)))
    return np.array([tuple(fields[name] for name in DECODE_PARAMS.names)], dtype=DECODE_PARAMS)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def seeded(*key) -> np.random.Generator:
    """A generator whose seed depends only on the test case (stable across runs)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ---------------------------------------------------------------------------
# Tolerances

U32 = 2.0**-24  # f32 unit roundoff

# Per-head RMSNorm + RoPE, f32: a 256-term sum of squares (relative error <= ~16 u per
# lane partial + 5 simd_sum levels), rsqrt (fast math: 2 ulp), two products, and the
# rotation a c - b s whose angle the kernel gets to ~1e-7 rad at any position (integer
# phase). All of it is < 1e-6 of the head's largest element; 1e-5 leaves room for GPU
# math while a float32 angle (error ~pos * 2^-24 rad, 6e-3 at position 1e5) fails.
TOL_QK = 1e-5

# Attention, f32 after an exact cache read: 256-term dots (random-walk error ~u |q||k|),
# exp2 (fast math: (3 + 2|x|) ulp, <= 4e-6 relative for the |x| <= 30 of these scores),
# sums over up to ~1000 positions in f32. Normwise error measured on the CPU runtime is
# ~1e-6; 5e-5 leaves room for GPU math and still fails on any exp/exp2 scale mistake,
# a dropped or extra position (>= 1e-3 here) or half-precision staging (~1e-3).
TOL_ATTN = 5e-5


# ---------------------------------------------------------------------------
# RoPE phase table (what the engine uploads as rope_turns)


def rope_turns(theta: float, rot: int = ROT) -> np.ndarray:
    """uint64 [rot/2]: round(2^64 * theta^(-2i/rot) / (2 pi)) mod 2^64, in double precision."""
    turns = [int(round(theta ** (-2.0 * i / rot) / (2.0 * math.pi) * 2.0**64)) % 2**64 for i in range(rot // 2)]
    return np.array(turns, dtype=np.uint64)


# ---------------------------------------------------------------------------
# References (float64)


def rms_heads(x, w, eps):
    """Per-head RMSNorm over the last axis, weight multiplied as stored."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, dtype=np.float64)


def rope(x, positions, theta, rot=ROT):
    """Half-split partial RoPE on x [rows, heads, HD] at positions [rows] (float64)."""
    x = np.array(x, dtype=np.float64)
    half = rot // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / rot)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half].copy(), x[..., half:rot].copy()
    x[..., :half] = a * c - b * s
    x[..., half:rot] = b * c + a * s
    return x


def mrope(x, positions, theta, sections, rot=ROT):
    """Interleaved multimodal RoPE (Qwen3.5, mlx-vlm's interleaved selector) on x [rows, heads, HD]
    at positions [rows, 3] (time, height, width): frequency pair i takes the height position when
    i % 3 == 1 and i < 3 sections[1], the width position when i % 3 == 2 and i < 3 sections[2],
    else the time position (float64)."""
    x = np.array(x, dtype=np.float64)
    half = rot // 2
    select = np.zeros(half, int)
    for comp, offset in ((1, 1), (2, 2)):
        select[offset:min(3 * sections[comp], half):3] = comp
    inv_freq = theta ** (-2.0 * np.arange(half) / rot)
    angle = np.asarray(positions, dtype=np.float64)[:, select] * inv_freq[None, :]
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half].copy(), x[..., half:rot].copy()
    x[..., :half] = a * c - b * s
    x[..., half:rot] = b * c + a * s
    return x


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def attention(q, gate, k, v, pos_base, nq, nkv):
    """Gated causal GQA attention, float64.

    q, gate: [rows, nq, HD]; k, v: [ctx, nkv, HD] (all cache positions); row r sits at
    position pos_base + r and attends to positions <= pos_base + r.
    Returns [rows, nq, HD] = softmax(q k^T / sqrt(HD)) v * sigmoid(gate).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    rows = q.shape[0]
    n_rep = nq // nkv
    out = np.empty((rows, nq, HD))
    for r in range(rows):
        n = pos_base + r + 1
        for h in range(nq):
            kvh = h // n_rep
            s = k[:n, kvh] @ q[r, h] / math.sqrt(HD)
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ v[:n, kvh]
    return out * sigmoid(gate)


# ---------------------------------------------------------------------------
# KV caches: raw bytes as the kernels see them (int8 plane, then f16 scale plane)

Q8_POISON = 0xFF  # fresh buffers: int8 -1 codes and f16 NaN scales


def q8_cache_bytes(max_ctx: int, kv_dim: int) -> int:
    return max_ctx * kv_dim + max_ctx * (kv_dim // Q8_BLOCK) * 2


def f16_cache_bytes(max_ctx: int, kv_dim: int) -> int:
    return max_ctx * kv_dim * 2


def split_q8(raw: np.ndarray, max_ctx: int, kv_dim: int):
    """Raw q8 cache bytes -> (codes int8 [max_ctx, kv_dim], scales float16 [max_ctx, kv_dim/32])."""
    codes = raw[:max_ctx * kv_dim].view(np.int8).reshape(max_ctx, kv_dim)
    scales = raw[max_ctx * kv_dim:q8_cache_bytes(max_ctx, kv_dim)].view(np.float16)
    return codes, scales.reshape(max_ctx, kv_dim // Q8_BLOCK)


def dequant_q8(codes, scales) -> np.ndarray:
    """code * scale per 32-element block, float64 (exact: both factors are small floats)."""
    d = np.repeat(scales.astype(np.float64), Q8_BLOCK, axis=-1)
    return codes.astype(np.float64) * d


def make_q8_cache(rng, ctx: int, max_ctx: int, kv_dim: int, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Random q8 cache bytes with positions < ctx filled (codes in [-127, 127], f16 scales
    of blocks spanning `spread` decades) and the rest poisoned; returns (raw, dequantized
    values [ctx, kv_dim])."""
    raw = np.full(q8_cache_bytes(max_ctx, kv_dim), Q8_POISON, dtype=np.uint8)
    codes, scales = split_q8(raw, max_ctx, kv_dim)
    codes[:ctx] = rng.integers(-127, 128, (ctx, kv_dim))
    mags = 10.0 ** rng.uniform(-spread / 2, spread / 2, (ctx, kv_dim // Q8_BLOCK))
    scales[:ctx] = (mags / 127.0 * 1.7).astype(np.float16)  # elements of size ~1
    return raw, dequant_q8(codes[:ctx], scales[:ctx])


def make_f16_cache(rng, ctx: int, max_ctx: int, kv_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Random f16 cache bytes, positions >= ctx poisoned (NaN); returns (raw, values [ctx, kv_dim])."""
    raw = np.full(f16_cache_bytes(max_ctx, kv_dim), Q8_POISON, dtype=np.uint8)
    vals = raw.view(np.float16).reshape(max_ctx, kv_dim)
    vals[:ctx] = rng.standard_normal((ctx, kv_dim)).astype(np.float16)
    return raw, vals[:ctx].astype(np.float64)


def quantize_q8_reference(x) -> tuple[np.ndarray, np.ndarray]:
    """The cache's q8 format for rows x [n, kv_dim] f32: d = f16(f32(amax) / 127) per
    block, codes = clamp(rint(x / d), +-127) against the stored d (0 where d == 0)."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(x.shape[0], -1, Q8_BLOCK)
    amax = np.abs(blocks).max(-1)
    d = (amax / np.float32(127.0)).astype(np.float16)
    df = d.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(df > 0, np.clip(np.rint(blocks / df), -127, 127), 0)
    return codes.astype(np.int8).reshape(x.shape), d


def attention_inputs(rng, rows, nq, scale=1.0):
    """q and gate halves [rows, nq, HD] like post-norm queries: N(0, 1) entries (times
    `scale`), so q.k / 16 is O(1) and the softmax is neither flat nor one-hot."""
    q = (rng.standard_normal((rows, nq, HD)) * scale).astype(np.float32)
    gate = (rng.standard_normal((rows, nq, HD)) * 2.0).astype(np.float32)
    return q, gate


def pack_q(q, gate, q_stride, pad_rows=0) -> np.ndarray:
    """[rows + pad_rows, q_stride] f32 rows of [query | gate] per head, padding NaN."""
    rows, nq, _ = q.shape
    buf = np.full((rows + pad_rows, q_stride), np.nan, dtype=np.float32)
    qg = np.concatenate([q, gate], axis=-1).reshape(rows, nq * 2 * HD)
    buf[:rows, :nq * 2 * HD] = qg
    return buf

