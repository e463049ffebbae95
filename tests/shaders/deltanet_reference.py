"""Numpy side of the deltanet.metal tests: mirrors of shaders/params/deltanet.h, test
data with realistic ranges, and float64 references written from docs/design.md, "Gated
DeltaNet", never from the kernels. The references are generic in d_k and d_v
(the kernels are specialised for 128/128), so their orientation is tested with d_k != d_v.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..support import reference as ref
from .params import header_constants


CONST = header_constants("deltanet")
D = CONST["MQ_DELTA_HEAD_DIM"]
SCAN_THREADS = CONST["MQ_DELTA_SCAN_THREADS"]
SCAN_ROWS = CONST["MQ_DELTA_SCAN_ROWS"]
SCAN_SIMDGROUPS = CONST["MQ_DELTA_SCAN_SIMDGROUPS"]
NORM_SIMDGROUPS = CONST["MQ_DELTA_NORM_SIMDGROUPS"]
HEAD_PARTIALS = CONST["MQ_DELTA_HEAD_PARTIALS"]

# ---------------------------------------------------------------------------
# Parameter structs (field order and types exactly as in params/deltanet.h)

SCAN_PARAMS = np.dtype([(n, "<u4") for n in ("n_k", "n_v", "ksize", "hist_slots", "snap_rows", "store_history",
                                                "x_stride", "ab_stride", "z_stride", "ss_stride", "state_snap_stride",
                                                "state_slot_stride", "hist_slot_stride", "snap_slot_stride",
                                                "norm_f32")] + [("qk_eps", "<f4")])
NORM_PARAMS = np.dtype([(n, "<u4") for n in ("n_k", "n_v", "hist_slots", "x_stride", "ss_stride",
                                                "hist_slot_stride")] + [("norm_eps", "<f4")])
RESTORE_PARAMS = np.dtype([(n, "<u4") for n in ("state_floats", "state_snap_stride", "planes")])


def pack(dtype: np.dtype, **fields) -> np.ndarray:
    missing = set(dtype.names) - set(fields)
    extra = set(fields) - set(dtype.names)
    assert not missing and not extra, f"struct fields: missing {missing}, unknown {extra}"
    return np.array([tuple(fields[n] for n in dtype.names)], dtype=dtype)


# ---------------------------------------------------------------------------
# Test data


def seeded(*key):
    """A generator whose seed depends only on the test case (stable across runs)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def channels(n_k: int, n_v: int, dk: int = D, dv: int = D) -> int:
    return 2 * n_k * dk + n_v * dv


def conv_inputs(rng, rows: int, n_k: int, n_v: int, ksize: int):
    """(x [rows][C], conv weight bf16 bits [C][K], history [K-1][C]) with the magnitudes of
    a real layer: projection outputs of order 1 with a few loud channels, conv taps
    of order 0.2-0.5."""
    c = channels(n_k, n_v)
    x = rng.standard_normal((rows, c)).astype(np.float32)
    x[:, rng.choice(c, size=8, replace=False)] *= 8.0
    w = (rng.standard_normal((c, ksize)) * 0.3).astype(np.float32)
    hist = rng.standard_normal((ksize - 1, c)).astype(np.float32)
    return x, ref.bf16_bits(w), hist


def gate_inputs(rng, rows: int, n_v: int):
    """(a, b [rows][n_v], A_log f32 [n_v], dt_bias bf16 bits [n_v]).

    A = exp(A_log) ~ U(1, 16) and dt_bias = softplus^-1(dt), dt log-uniform in
    [1e-3, 0.1] (the Mamba2/Qwen3-Next initialisation); a, b ~ N(0, 2^2). A few
    extreme a, b values exercise both softplus branches and the saturated sigmoid.
    """
    a = (rng.standard_normal((rows, n_v)) * 2.0).astype(np.float32)
    b = (rng.standard_normal((rows, n_v)) * 2.0).astype(np.float32)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    extremes = np.array([30.0, -30.0, 12.0, -12.0], np.float32)
    flat_a[: min(4, flat_a.size)] = extremes[: min(4, flat_a.size)]
    flat_b[-min(4, flat_b.size):] = extremes[: min(4, flat_b.size)]
    a_log = np.log(rng.uniform(1.0, 16.0, n_v)).astype(np.float32)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), n_v))
    dt_bias = ref.bf16_bits((dt + np.log(-np.expm1(-dt))).astype(np.float32))
    return a, b, a_log, dt_bias


# ---------------------------------------------------------------------------
# References (float64)


def silu(x):
    x = np.asarray(x, np.float64)
    return x / (1.0 + np.exp(-x))


def softplus(x):
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def conv_ref(x, w, hist):
    """Causal depthwise conv + silu. y[t][c] = silu(sum_j w[c][j] * u[t-K+1+j][c]) over the
    sequence u = [history | x]. Returns (y [rows][C], new history [K-1][C], the history
    after each row [rows][K-1][C])."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    k = w.shape[1]
    u = np.concatenate([np.asarray(hist, np.float64).reshape(k - 1, x.shape[1]), x], axis=0)
    rows = x.shape[0]
    y = np.zeros_like(x)
    for t in range(rows):
        y[t] = np.einsum("jc,cj->c", u[t:t + k], w)
    after = np.stack([u[t + 1:t + k] for t in range(rows)]) if rows else np.zeros((0, k - 1, x.shape[1]))
    return silu(y), u[rows:rows + k - 1].copy(), after


def qk_norm_ref(y, n_k: int, dk: int, eps: float = 1e-6):
    """Split [q | k | v] rows and L2-normalise q (with 1/sqrt(dk)) and k per head.
    Returns (q [rows][n_k][dk], k [rows][n_k][dk], v [rows][rest])."""
    y = np.asarray(y, np.float64)
    rows = y.shape[0]
    q = y[:, :n_k * dk].reshape(rows, n_k, dk)
    k = y[:, n_k * dk:2 * n_k * dk].reshape(rows, n_k, dk)
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + eps) / np.sqrt(dk)
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + eps)
    return q, k, y[:, 2 * n_k * dk:]


def gates_ref(a, b, a_log, dt_bias):
    """decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b); also the
    exponent x = exp(A_log) * softplus(a + dt_bias) (for error bounds)."""
    x = np.exp(np.asarray(a_log, np.float64)) * softplus(np.asarray(a, np.float64) + np.asarray(dt_bias, np.float64))
    return np.exp(-x), sigmoid(b), x


def scan_ref(q, k, v, decay, beta, state):
    """The recurrence, generic in dk and dv.

    q, k [rows][n_k][dk]; v [rows][n_v][dv]; decay, beta [rows][n_v];
    state [n_v][dv][dk] (S[h][i][j]: i a dv index). v-head h reads k-head h // (n_v/n_k).
    Per row: S *= decay; kv = S k; S += ((v - kv) * beta) outer k; y = S q.
    Returns (y [rows][n_v][dv], final state, the state after each row [rows][n_v][dv][dk]).
    """
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = np.array(state, np.float64, copy=True)
    rows, n_k, dk = q.shape
    n_v, dv = v.shape[1], v.shape[2]
    assert s.shape == (n_v, dv, dk), f"state must be [n_v][dv][dk] = {(n_v, dv, dk)}, got {s.shape}"
    group = n_v // n_k
    y = np.zeros((rows, n_v, dv))
    after = np.zeros((rows, n_v, dv, dk))
    for t in range(rows):
        for h in range(n_v):
            kh, qh = k[t, h // group], q[t, h // group]
            s[h] *= decay[t, h]
            kv = s[h] @ kh
            s[h] += np.outer((v[t, h] - kv) * beta[t, h], kh)
            y[t, h] = s[h] @ qh
        after[t] = s
    return y, s, after


def gated_norm_ref(y, z, w, eps: float):
    """Per v-head, NOT shifted: y * rsqrt(mean_dv(y^2) + eps) * w * silu(z).
    y, z [rows][n_v][dv]; w [dv]."""
    y = np.asarray(y, np.float64)
    inv = 1.0 / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps)
    return y * inv * np.asarray(w, np.float64) * silu(z)


def head_partials_ref(y):
    """The scan's partial sums of y^2 per head: [rows][n_v][HEAD_PARTIALS], partial b over dv
    rows b*SCAN_ROWS .. +SCAN_ROWS-1. y [rows][n_v][D]."""
    y = np.asarray(y, np.float64)
    rows, n_v, dv = y.shape
    return np.sum((y * y).reshape(rows, n_v, dv // SCAN_ROWS, SCAN_ROWS), axis=-1)
