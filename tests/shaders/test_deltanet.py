"""shaders/deltanet.metal: the Gated DeltaNet core (conv + norms + gates, scan + gated
norm, snapshot restore) against float64 numpy written from DESIGN.md section 2.

Outputs start as NaN and are followed by NaN guard rows/planes, and the inputs' row
padding is NaN too (so a wrong stride reads NaN into the result). Shapes use n_k != n_v
(2 and 6: v-head h reads k-head h // 3, so a tiled mapping fails) and rows 1, 7, 33;
the conv runs with K = 4, 2 and 1; one 27B-sized shape per kernel (16 k / 48 v heads,
10240 channels). The references are generic in d_k, d_v and are themselves checked
with d_k != d_v; the scan test also shows that a transposed state layout would fail.

Tolerances (relative to the largest reference value unless stated):
- TOL_FAST = 2e-5 for paths through exp/rsqrt: Metal's fast-math exp is within
  (3 + 2|x|) ulp (<= 4e-6 for |x| <= 30), rsqrt 2 ulp; K-term f32 conv sums and the
  128-term f32 norm sums add ~1e-7. The CPU runtime (libm) lands near 1e-7.
- TOL_SCAN = 1e-5 for the scan's y and state: f32 recurrence with 128-term dots; the
  update contracts (decay <= 1, |k| = 1, beta < 1), so errors do not grow with rows
  (a float32 simulation stays near 3e-7 normwise over 33 rows).
- Gates elementwise: decay within 1e-5 (1 + x) relative, x = exp(A_log) softplus(.)
  the exponent (an f32 rounding of x moves exp(-x) by x ulp, and fast-math exp adds
  (3 + 2x) ulp); beta within 1e-5 (1 + |b|) relative, for the same reason.
- Copies (history, snapshots, restore) are exact.
"""

import numpy as np
import pytest

from .. import reference as ref
from .deltanet_reference import (
    CONV_PARAMS, CONV_SIMDGROUPS, D, RESTORE_PARAMS, SCAN_PARAMS, SCAN_THREADS, channels, conv_inputs, conv_ref,
    gate_inputs, gated_norm_ref, gates_ref, pack, qk_norm_ref, scan_ref, seeded, silu)

TOL_FAST = 2e-5
TOL_SCAN = 1e-5
NORM_EPS = 1e-6
QK_EPS = 1e-6
BF16 = np.uint16  # bf16 tensors travel as their bit patterns


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("deltanet.metal")


def nan_buffer(dev, *shape):
    return dev.buffer(np.full(shape, np.nan, dtype=np.float32))


def padded(a, cols):
    """a [rows][n] inside NaN padding to `cols` columns (tests the row stride)."""
    out = np.full((a.shape[0], cols), np.nan, np.float32)
    out[:, :a.shape[1]] = a
    return out


# ---------------------------------------------------------------------------
# Reference self-checks (no device): the references are generic in d_k and d_v


def test_reference_scan_is_oriented_with_dk_ne_dv():
    rng = seeded("scan-orientation")
    n_k, n_v, dk, dv = 1, 2, 5, 3
    q = rng.standard_normal((2, n_k, dk))
    k = rng.standard_normal((2, n_k, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((2, n_v, dv))
    decay = np.array([[0.9, 0.5], [0.7, 0.3]])
    beta = np.array([[0.2, 0.6], [0.4, 0.8]])
    # From a zero state the first row gives S = beta v k^T and y = beta v (k . q).
    y, s, after = scan_ref(q, k, v, decay, beta, np.zeros((n_v, dv, dk)))
    for h in range(n_v):
        s1 = beta[0, h] * np.outer(v[0, h], k[0, 0])
        np.testing.assert_allclose(after[0, h], s1, rtol=1e-12)
        np.testing.assert_allclose(y[0, h], beta[0, h] * v[0, h] * (k[0, 0] @ q[0, 0]), rtol=1e-12)
        # Second row, written out: S2 = d S1 + beta (v - d S1 k) k^T, y = S2 q.
        d = decay[1, h]
        s2 = d * s1 + beta[1, h] * np.outer(v[1, h] - d * s1 @ k[1, 0], k[1, 0])
        np.testing.assert_allclose(s[h], s2, rtol=1e-12)
        np.testing.assert_allclose(y[1, h], s2 @ q[1, 0], rtol=1e-12)
    with pytest.raises(AssertionError, match="state must be"):
        scan_ref(q, k, v, decay, beta, np.zeros((n_v, dk, dv)))  # transposed layout refused


def test_reference_scan_groups_heads_not_tiled():
    rng = seeded("scan-grouping")
    n_k, n_v, dk, dv = 2, 4, 3, 2
    q = rng.standard_normal((1, n_k, dk))
    k = rng.standard_normal((1, n_k, dk))
    v = rng.standard_normal((1, n_v, dv))
    y, _, _ = scan_ref(q, k, v, np.ones((1, n_v)), np.ones((1, n_v)), np.zeros((n_v, dv, dk)))
    for h in range(n_v):
        g = h // 2  # v-heads 0, 1 -> k-head 0; 2, 3 -> k-head 1
        np.testing.assert_allclose(y[0, h], v[0, h] * (k[0, g] @ q[0, g]), rtol=1e-12)


def test_reference_conv_taps_and_history():
    x = np.arange(1, 7, dtype=np.float64).reshape(3, 2)  # rows 1,2 / 3,4 / 5,6
    w = np.array([[1.0, 10.0, 100.0], [0.5, 0.25, 2.0]])  # tap 2 multiplies the current row
    hist = np.array([[-1.0, -2.0], [-3.0, -4.0]])  # oldest first
    y, new_hist, after = conv_ref(x, w, hist)
    raw0 = np.array([1 * -1 + 10 * -3 + 100 * 1, 0.5 * -2 + 0.25 * -4 + 2 * 2])
    np.testing.assert_allclose(y[0], silu(raw0))
    raw2 = np.array([1 * 1 + 10 * 3 + 100 * 5, 0.5 * 2 + 0.25 * 4 + 2 * 6])
    np.testing.assert_allclose(y[2], silu(raw2))
    np.testing.assert_array_equal(new_hist, x[1:])
    np.testing.assert_array_equal(after[0], np.array([[-3.0, -4.0], [1.0, 2.0]]))


def test_reference_gates_ranges():
    a, b, a_log, dt_bias = gate_inputs(seeded("gates-range"), 64, 6)
    decay, beta, _ = gates_ref(a, b, a_log, ref.bf16_to_f32(dt_bias))
    assert np.all((decay >= 0) & (decay < 1)) and np.all((beta > 0) & (beta < 1))
    assert np.median(decay) > 0.3  # realistic: most heads keep much of their state


# ---------------------------------------------------------------------------
# delta_conv_prep: conv + silu + q/k norms + gates + history snapshots


def run_conv(dev, lib, *, x, w_bits, hist, a, b, a_log, dt_bias, n_k, n_v, snap_rows, simdgroups, alog_bf16,
             wf32=False):
    """delta_conv_prep; ``wf32``: the *_wf32 variant, given the same conv/dt_bias values as f32."""
    rows, c = x.shape
    ksize = w_bits.shape[1]
    x_stride, ab_stride = c + 8, n_v + 3
    plane = (ksize - 1) * c
    snap_stride = plane + 4
    xb = dev.buffer(padded(x, x_stride))
    hist_b = dev.buffer(hist.reshape(-1).copy() if plane else np.zeros(4, np.float32))
    qkv = nan_buffer(dev, rows + 1, c)
    gates = nan_buffer(dev, rows + 1, n_v, 2)
    snaps = nan_buffer(dev, max(snap_rows + 1, 1) * snap_stride + 4)
    alog_buf = dev.buffer(ref.bf16_bits(a_log).astype(BF16) if alog_bf16 else a_log.astype(np.float32))
    params = pack(CONV_PARAMS, n_k=n_k, n_v=n_v, ksize=ksize, rows=rows, snap_rows=snap_rows, x_stride=x_stride,
                  ab_stride=ab_stride, hist_snap_stride=snap_stride, qk_eps=QK_EPS)
    kernel = lib.kernel(("delta_conv_prep_alog_bf16" if alog_bf16 else "delta_conv_prep_alog_f32") +
                        ("_wf32" if wf32 else ""))
    def vector(bits):
        return dev.buffer(ref.bf16_to_f32(bits) if wf32 else bits.astype(BF16))
    kernel.dispatch({0: xb, 1: vector(w_bits), 2: hist_b, 3: qkv, 4: dev.buffer(padded(a, ab_stride)),
                     5: dev.buffer(padded(b, ab_stride)), 6: alog_buf, 7: vector(dt_bias), 8: gates,
                     9: snaps, 10: params},
                    threadgroups=(2 * n_k + n_v,), threads=(32 * simdgroups,))
    got_qkv = qkv.numpy(np.float32, (rows + 1, c))
    ref.assert_untouched(got_qkv[rows], "qkv past the last row")
    got_gates = gates.numpy(np.float32, (rows + 1, n_v, 2))
    ref.assert_untouched(got_gates[rows], "gates past the last row")
    raw = snaps.numpy(np.float32)
    got_snaps = np.stack([raw[t * snap_stride:t * snap_stride + plane] for t in range(snap_rows)]) \
        if snap_rows else np.zeros((0, plane), np.float32)
    for t in range(snap_rows):
        ref.assert_untouched(raw[t * snap_stride + plane:(t + 1) * snap_stride], f"snapshot padding after plane {t}")
    ref.assert_untouched(raw[snap_rows * snap_stride:], "snapshot planes past snap_rows")
    np.testing.assert_array_equal(xb.numpy(np.float32, (rows, x_stride))[:, :c], x, err_msg="x was modified")
    new_hist = hist_b.numpy(np.float32)[:plane].reshape(ksize - 1, c)
    return got_qkv[:rows], got_gates[:rows], new_hist, got_snaps.reshape(snap_rows, ksize - 1, c)


def check_conv(got, *, x, w_bits, hist, a, b, a_log, dt_bias, n_k, n_v, alog_bf16, what):
    got_qkv, got_gates, new_hist, snaps = got
    rows = x.shape[0]
    y, want_hist, after = conv_ref(x, ref.bf16_to_f32(w_bits), hist)
    q, k, v = qk_norm_ref(y, n_k, D, QK_EPS)
    qk = n_k * D
    ref.assert_close(got_qkv[:, :qk], q.reshape(rows, -1), TOL_FAST, f"{what}: q")
    ref.assert_close(got_qkv[:, qk:2 * qk], k.reshape(rows, -1), TOL_FAST, f"{what}: k")
    ref.assert_close(got_qkv[:, 2 * qk:], v, TOL_FAST, f"{what}: v")
    # The history keeps raw inputs: exact copies.
    np.testing.assert_array_equal(new_hist, want_hist.astype(np.float32), err_msg=f"{what}: history")
    np.testing.assert_array_equal(snaps, after[:snaps.shape[0]].astype(np.float32), err_msg=f"{what}: snapshots")
    alog = ref.round_bf16(a_log) if alog_bf16 else a_log
    decay, beta, expo = gates_ref(a, b, alog, ref.bf16_to_f32(dt_bias))
    ref.assert_within(got_gates[..., 0], decay, 1e-5 * (1 + expo) * decay + 1e-37, f"{what}: decay")
    ref.assert_within(got_gates[..., 1], beta, 1e-5 * (1 + np.abs(b)) * beta, f"{what}: beta")


CONV_CASES = [(ksize, rows) for ksize in (4, 2) for rows in (1, 7, 33)] + [(1, 7)]


@pytest.mark.parametrize("ksize,rows", CONV_CASES)
def test_conv_prep(dev, lib, ksize, rows):
    rng = seeded("conv", ksize, rows)
    n_k, n_v = 2, 6
    x, w_bits, hist = conv_inputs(rng, rows, n_k, n_v, ksize)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    alog_bf16 = rows == 7  # both A_log variants across the cases
    snap_rows = rows - 1
    inputs = dict(x=x, w_bits=w_bits, hist=hist, a=a, b=b, a_log=a_log, dt_bias=dt_bias, n_k=n_k, n_v=n_v)
    got = run_conv(dev, lib, **inputs, snap_rows=snap_rows, simdgroups=CONV_SIMDGROUPS, alog_bf16=alog_bf16)
    check_conv(got, **inputs, alog_bf16=alog_bf16, what=f"K={ksize} rows={rows}")


@pytest.mark.parametrize("simdgroups", [1, 3])
def test_conv_prep_any_threadgroup_size_gives_identical_results(dev, lib, simdgroups):
    rng = seeded("conv-sg")
    n_k, n_v, rows, ksize = 2, 6, 9, 4
    x, w_bits, hist = conv_inputs(rng, rows, n_k, n_v, ksize)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    inputs = dict(x=x, w_bits=w_bits, hist=hist, a=a, b=b, a_log=a_log, dt_bias=dt_bias, n_k=n_k, n_v=n_v)
    base = run_conv(dev, lib, **inputs, snap_rows=4, simdgroups=CONV_SIMDGROUPS, alog_bf16=False)
    check_conv(base, **inputs, alog_bf16=False, what="4 simdgroups")
    other = run_conv(dev, lib, **inputs, snap_rows=4, simdgroups=simdgroups, alog_bf16=False)
    for g, o, name in zip(base, other, ("qkv", "gates", "history", "snapshots")):
        np.testing.assert_array_equal(o, g, err_msg=f"{name} differs with {simdgroups} simdgroups")


def test_conv_prep_27b(dev, lib):
    rng = seeded("conv-27b")
    n_k, n_v, rows, ksize = 16, 48, 3, 4
    assert channels(n_k, n_v) == 10240
    x, w_bits, hist = conv_inputs(rng, rows, n_k, n_v, ksize)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    inputs = dict(x=x, w_bits=w_bits, hist=hist, a=a, b=b, a_log=a_log, dt_bias=dt_bias, n_k=n_k, n_v=n_v)
    got = run_conv(dev, lib, **inputs, snap_rows=2, simdgroups=CONV_SIMDGROUPS, alog_bf16=False)
    check_conv(got, **inputs, alog_bf16=False, what="27B")


# ---------------------------------------------------------------------------
# delta_scan_norm: the recurrence + gated output norm


def scan_inputs(rng, rows, n_k, n_v):
    """qkv rows as delta_conv_prep leaves them, gates with realistic decay/beta, z, the
    norm weight (bf16 bits) and a non-symmetric state like one after many tokens."""
    raw = rng.standard_normal((rows, channels(n_k, n_v)))
    q, k, v = qk_norm_ref(silu(raw * 2.0), n_k, D, QK_EPS)
    qkv = np.concatenate([q.reshape(rows, -1), k.reshape(rows, -1), v], axis=1).astype(np.float32)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    decay, beta, _ = gates_ref(a, b, a_log, ref.bf16_to_f32(dt_bias))
    gates = np.stack([decay, beta], axis=-1).astype(np.float32)
    z = (rng.standard_normal((rows, n_v * D)) * 2.0).astype(np.float32)
    w_bits = ref.bf16_bits(rng.uniform(0.5, 1.5, D).astype(np.float32))
    state = (rng.standard_normal((n_v, D, D)) * 0.1).astype(np.float32)
    state[:, :, :7] += 0.5  # columns (dk) differ from rows (dv): a transposed state shows
    return qkv, gates, z, w_bits, state


def run_scan(dev, lib, *, qkv, gates, z, w_bits, state, n_k, n_v, snap_rows, gated_norm, state_buf=None,
             threads=SCAN_THREADS, wf32=False):
    rows = qkv.shape[0]
    plane = n_v * D * D
    snap_stride = plane + 8
    z_stride = n_v * D + 4
    st = state_buf if state_buf is not None else dev.buffer(state.reshape(-1).copy())
    out = nan_buffer(dev, rows + 1, n_v * D)
    snaps = nan_buffer(dev, (snap_rows + 1) * snap_stride)
    params = pack(SCAN_PARAMS, n_k=n_k, n_v=n_v, rows=rows, snap_rows=snap_rows, z_stride=z_stride,
                  state_snap_stride=snap_stride, gated_norm=int(gated_norm), norm_eps=NORM_EPS)
    lib.kernel("delta_scan_norm" + ("_wf32" if wf32 else "")).dispatch(
        {0: dev.buffer(qkv), 1: dev.buffer(gates), 2: dev.buffer(padded(z, z_stride)),
         3: dev.buffer(ref.bf16_to_f32(w_bits) if wf32 else w_bits.astype(BF16)), 4: st, 5: out, 6: snaps, 7: params},
        threadgroups=(n_v,), threads=(threads,))
    got = out.numpy(np.float32, (rows + 1, n_v * D))
    ref.assert_untouched(got[rows], "out past the last row")
    raw = snaps.numpy(np.float32)
    for t in range(snap_rows):
        ref.assert_untouched(raw[t * snap_stride + plane:(t + 1) * snap_stride], f"snapshot padding after plane {t}")
    ref.assert_untouched(raw[snap_rows * snap_stride:], "snapshot planes past snap_rows")
    got_snaps = np.stack([raw[t * snap_stride:t * snap_stride + plane].reshape(n_v, D, D) for t in range(snap_rows)]) \
        if snap_rows else np.zeros((0, n_v, D, D), np.float32)
    return got[:rows].reshape(rows, n_v, D), st.numpy(np.float32, (n_v, D, D)), got_snaps


def scan_reference(qkv, gates, state, n_k, n_v):
    rows = qkv.shape[0]
    qk = n_k * D
    q = qkv[:, :qk].reshape(rows, n_k, D)
    k = qkv[:, qk:2 * qk].reshape(rows, n_k, D)
    v = qkv[:, 2 * qk:].reshape(rows, n_v, D)
    return scan_ref(q, k, v, gates[..., 0].astype(np.float64), gates[..., 1].astype(np.float64), state)


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_scan_raw_state_and_snapshots(dev, lib, rows):
    rng = seeded("scan", rows)
    n_k, n_v = 2, 6
    qkv, gates, z, w_bits, state = scan_inputs(rng, rows, n_k, n_v)
    y, s, snaps = run_scan(dev, lib, qkv=qkv, gates=gates, z=z, w_bits=w_bits, state=state, n_k=n_k, n_v=n_v,
                           snap_rows=rows - 1, gated_norm=False)
    want_y, want_s, want_after = scan_reference(qkv, gates, state, n_k, n_v)
    ref.assert_close(y, want_y, TOL_SCAN, f"rows={rows}: y")
    ref.assert_close(s, want_s, TOL_SCAN, f"rows={rows}: state")
    ref.assert_close(snaps, want_after[:rows - 1], TOL_SCAN, f"rows={rows}: snapshots")
    # The same check would catch a kernel that keeps the state transposed ([dk][dv]).
    alt_y, _, _ = scan_reference(qkv, gates, state.transpose(0, 2, 1), n_k, n_v)
    assert ref.rel_err(y, alt_y) > 100 * TOL_SCAN, "a transposed initial state should change y"


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_scan_gated_norm(dev, lib, rows):
    rng = seeded("scan-norm", rows)
    n_k, n_v = 2, 6
    qkv, gates, z, w_bits, state = scan_inputs(rng, rows, n_k, n_v)
    out, s, _ = run_scan(dev, lib, qkv=qkv, gates=gates, z=z, w_bits=w_bits, state=state, n_k=n_k, n_v=n_v,
                         snap_rows=0, gated_norm=True)
    want_y, want_s, _ = scan_reference(qkv, gates, state, n_k, n_v)
    want = gated_norm_ref(want_y, z.reshape(rows, n_v, D), ref.bf16_to_f32(w_bits), NORM_EPS)
    # y's scan error (TOL_SCAN) carries through the normalisation; exp/rsqrt add TOL_FAST.
    ref.assert_close(out, want, TOL_SCAN + TOL_FAST, f"rows={rows}: gated norm")
    ref.assert_close(s, want_s, TOL_SCAN, f"rows={rows}: state")
    # A shifted (1 + w) weight, or a missing silu(z), is far outside the tolerance.
    shifted = gated_norm_ref(want_y, z.reshape(rows, n_v, D), 1.0 + ref.bf16_to_f32(w_bits), NORM_EPS)
    assert ref.rel_err(out, shifted) > 0.1


def test_wf32_variants_read_f32_vectors(dev, lib):
    """delta_conv_prep_alog_f32_wf32 / delta_scan_norm_wf32 (f32 conv, dt_bias and norm weights,
    as f32 or f16 checkpoints give them) reproduce the bf16 variants bit for bit on the same values."""
    rng = seeded("wf32")
    n_k, n_v, rows = 2, 6, 7
    x, w_bits, hist = conv_inputs(rng, rows, n_k, n_v, 4)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    inputs = dict(x=x, w_bits=w_bits, hist=hist, a=a, b=b, a_log=a_log, dt_bias=dt_bias, n_k=n_k, n_v=n_v,
                  snap_rows=3, simdgroups=CONV_SIMDGROUPS, alog_bf16=False)
    for got, want in zip(run_conv(dev, lib, **inputs, wf32=True), run_conv(dev, lib, **inputs)):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    qkv, gates, z, w_bits, state = scan_inputs(rng, rows, n_k, n_v)
    inputs = dict(qkv=qkv, gates=gates, z=z, w_bits=w_bits, state=state, n_k=n_k, n_v=n_v, snap_rows=2,
                  gated_norm=True)
    for got, want in zip(run_scan(dev, lib, **inputs, wf32=True), run_scan(dev, lib, **inputs)):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_scan_27b(dev, lib):
    rng = seeded("scan-27b")
    n_k, n_v, rows = 16, 48, 2
    qkv, gates, z, w_bits, state = scan_inputs(rng, rows, n_k, n_v)
    out, s, snaps = run_scan(dev, lib, qkv=qkv, gates=gates, z=z, w_bits=w_bits, state=state, n_k=n_k, n_v=n_v,
                             snap_rows=1, gated_norm=True)
    want_y, want_s, want_after = scan_reference(qkv, gates, state, n_k, n_v)
    want = gated_norm_ref(want_y, z.reshape(rows, n_v, D), ref.bf16_to_f32(w_bits), NORM_EPS)
    ref.assert_close(out, want, TOL_SCAN + TOL_FAST, "27B gated norm")
    ref.assert_close(s, want_s, TOL_SCAN, "27B state")
    ref.assert_close(snaps, want_after[:1], TOL_SCAN, "27B snapshot")


@pytest.mark.parametrize("gated_norm", [True, False])
@pytest.mark.parametrize("threads", [32, 96, 256, 384])
def test_scan_smaller_threadgroups_give_the_same_bits(dev, lib, threads, gated_norm):
    """Below its declared MQ_DELTA_SCAN_THREADS (a pipeline's limit may be lower) each
    SIMD-group scans several 8-row blocks; 96 and 384 threads leave the 16 blocks uneven.
    Every output, the state and the snapshots equal the full-size run bit for bit."""
    rng = seeded("scan-threads", threads, gated_norm)
    n_k, n_v, rows = 2, 6, 7
    qkv, gates, z, w_bits, state = scan_inputs(rng, rows, n_k, n_v)
    args = dict(qkv=qkv, gates=gates, z=z, w_bits=w_bits, state=state, n_k=n_k, n_v=n_v, snap_rows=3,
                gated_norm=gated_norm)
    full = run_scan(dev, lib, **args)
    small = run_scan(dev, lib, **args, threads=threads)
    for what, a, b in zip(("out", "state", "snapshots"), small, full):
        np.testing.assert_array_equal(a, b, err_msg=f"{threads} threads: {what}")
    want_y, want_s, _ = scan_reference(qkv, gates, state, n_k, n_v)
    if gated_norm:
        want_y = gated_norm_ref(want_y, z.reshape(rows, n_v, D), ref.bf16_to_f32(w_bits), NORM_EPS)
    ref.assert_close(small[0], want_y, TOL_SCAN + TOL_FAST, f"{threads} threads: out")
    ref.assert_close(small[1], want_s, TOL_SCAN, f"{threads} threads: state")


def test_scan_declares_its_threadgroup_size(dev, lib):
    assert lib.kernel("delta_scan_norm").max_threads_per_threadgroup <= SCAN_THREADS


# ---------------------------------------------------------------------------
# The layer as the engine encodes it: conv_prep -> scan in one command buffer,
# speculative rollback, and rows-at-once == row-by-row (bit for bit)


class Layer:
    """One DeltaNet layer's buffers and its two dispatches (plus restore)."""

    def __init__(self, dev, lib, rng, n_k, n_v, ksize, max_rows):
        self.dev, self.lib, self.n_k, self.n_v, self.ksize = dev, lib, n_k, n_v, ksize
        self.c = channels(n_k, n_v)
        _, w_bits, hist = conv_inputs(rng, 1, n_k, n_v, ksize)
        _, _, a_log, dt_bias = gate_inputs(rng, 1, n_v)
        self.conv_w = dev.buffer(w_bits.astype(BF16))
        self.a_log = dev.buffer(a_log)
        self.dt_bias = dev.buffer(dt_bias.astype(BF16))
        self.norm_w = dev.buffer(ref.bf16_bits(rng.uniform(0.5, 1.5, D).astype(np.float32)).astype(BF16))
        self.hist = dev.buffer(hist.reshape(-1).copy())
        self.state = dev.buffer((rng.standard_normal((n_v, D, D)) * 0.1).astype(np.float32))
        self.hist_plane = (ksize - 1) * self.c
        self.state_plane = n_v * D * D
        self.hist_snaps = nan_buffer(dev, max_rows * self.hist_plane)
        self.state_snaps = nan_buffer(dev, max_rows * self.state_plane)

    def step(self, x, a, b, z, snap_rows=0):
        dev, rows = self.dev, x.shape[0]
        qkv = nan_buffer(dev, rows, self.c)
        gates = nan_buffer(dev, rows, self.n_v, 2)
        out = nan_buffer(dev, rows, self.n_v * D)
        conv_p = pack(CONV_PARAMS, n_k=self.n_k, n_v=self.n_v, ksize=self.ksize, rows=rows, snap_rows=snap_rows,
                      x_stride=self.c, ab_stride=self.n_v, hist_snap_stride=self.hist_plane, qk_eps=QK_EPS)
        scan_p = pack(SCAN_PARAMS, n_k=self.n_k, n_v=self.n_v, rows=rows, snap_rows=snap_rows, z_stride=self.n_v * D,
                      state_snap_stride=self.state_plane, gated_norm=1, norm_eps=NORM_EPS)
        cb = dev.command_buffer()
        cb.dispatch(self.lib.kernel("delta_conv_prep_alog_f32"),
                    {0: dev.buffer(x), 1: self.conv_w, 2: self.hist, 3: qkv, 4: dev.buffer(a), 5: dev.buffer(b),
                     6: self.a_log, 7: self.dt_bias, 8: gates, 9: self.hist_snaps, 10: conv_p},
                    (2 * self.n_k + self.n_v,), (32 * (CONV_SIMDGROUPS if rows > 1 else 1),))
        cb.barrier()
        cb.dispatch(self.lib.kernel("delta_scan_norm"),
                    {0: qkv, 1: gates, 2: dev.buffer(z), 3: self.norm_w, 4: self.state, 5: out, 6: self.state_snaps,
                     7: scan_p},
                    (self.n_v,), (SCAN_THREADS,))
        cb.commit()
        cb.wait()
        return qkv.numpy(np.float32, (rows, self.c)), out.numpy(np.float32, (rows, self.n_v * D))

    def restore(self, plane, planes):
        p = pack(RESTORE_PARAMS, state_floats=self.state_plane, hist_floats=self.hist_plane,
                 state_snap_stride=self.state_plane, hist_snap_stride=self.hist_plane, planes=planes)
        total4 = (self.state_plane + self.hist_plane) // 4
        self.lib.kernel("delta_restore").dispatch_threads(
            {0: self.state, 1: self.state_snaps, 2: self.hist, 3: self.hist_snaps,
             4: self.dev.buffer(np.array([plane], np.uint32)), 5: p}, grid=(total4,), threads=(64,))

    def snapshot(self):
        return self.state.numpy(np.float32).copy(), self.hist.numpy(np.float32)[:self.hist_plane].copy()


def layer_inputs(rng, rows, n_k, n_v):
    x, _, _ = conv_inputs(rng, rows, n_k, n_v, 2)
    a, b, _, _ = gate_inputs(rng, rows, n_v)
    z = (rng.standard_normal((rows, n_v * D)) * 2.0).astype(np.float32)
    return x, a, b, z


def test_layer_rows_at_once_equal_row_by_row_bitwise(dev, lib):
    """Verify rows must reproduce decode rows exactly (speculative decoding relies on it)."""
    n_k, n_v, ksize, rows = 2, 6, 4, 7
    x, a, b, z = layer_inputs(seeded("layer-inputs"), rows, n_k, n_v)
    batched = Layer(dev, lib, seeded("layer"), n_k, n_v, ksize, rows)
    single = Layer(dev, lib, seeded("layer"), n_k, n_v, ksize, rows)
    qkv_b, out_b = batched.step(x, a, b, z, snap_rows=rows - 1)
    for t in range(rows):
        qkv_1, out_1 = single.step(x[t:t + 1], a[t:t + 1], b[t:t + 1], z[t:t + 1])
        np.testing.assert_array_equal(qkv_1[0], qkv_b[t], err_msg=f"conv output row {t}")
        np.testing.assert_array_equal(out_1[0], out_b[t], err_msg=f"scan output row {t}")
    for got, want, name in zip(batched.snapshot(), single.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("accepted", [1, 3, 5, 6])
def test_layer_restore_equals_running_only_the_accepted_rows(dev, lib, accepted):
    n_k, n_v, ksize, rows = 2, 6, 4, 6
    x, a, b, z = layer_inputs(seeded("restore-inputs"), rows, n_k, n_v)
    spec = Layer(dev, lib, seeded("restore"), n_k, n_v, ksize, rows)
    plain = Layer(dev, lib, seeded("restore"), n_k, n_v, ksize, rows)
    spec.step(x, a, b, z, snap_rows=rows - 1)
    spec.restore(accepted - 1, planes=rows - 1)  # keep rows 0 .. accepted-1 (all rows: no copy)
    plain.step(x[:accepted], a[:accepted], b[:accepted], z[:accepted])
    for got, want, name in zip(spec.snapshot(), plain.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} after restoring plane {accepted - 1}")
    # And decoding continues identically from the restored state.
    x2, a2, b2, z2 = layer_inputs(seeded("restore-next"), 1, n_k, n_v)
    np.testing.assert_array_equal(spec.step(x2, a2, b2, z2)[1], plain.step(x2, a2, b2, z2)[1])


def test_restore_copies_exactly_the_plane_and_nothing_else(dev, lib):
    rng = seeded("restore-only")
    state_floats, hist_floats, planes = 3 * 128, 2 * 64, 3
    s_stride, h_stride = state_floats + 12, hist_floats + 4
    state_snaps = rng.standard_normal(planes * s_stride).astype(np.float32)
    hist_snaps = rng.standard_normal(planes * h_stride).astype(np.float32)
    state = nan_buffer(dev, state_floats + 8)
    hist = nan_buffer(dev, hist_floats + 8)
    p = pack(RESTORE_PARAMS, state_floats=state_floats, hist_floats=hist_floats, state_snap_stride=s_stride,
             hist_snap_stride=h_stride, planes=planes)
    lib.kernel("delta_restore").dispatch_threads(
        {0: state, 1: dev.buffer(state_snaps), 2: hist, 3: dev.buffer(hist_snaps),
         4: dev.buffer(np.array([2], np.uint32)), 5: p},
        grid=((state_floats + hist_floats) // 4,), threads=(32,))
    got_s, got_h = state.numpy(np.float32), hist.numpy(np.float32)
    np.testing.assert_array_equal(got_s[:state_floats], state_snaps[2 * s_stride:2 * s_stride + state_floats])
    np.testing.assert_array_equal(got_h[:hist_floats], hist_snaps[2 * h_stride:2 * h_stride + hist_floats])
    ref.assert_untouched(got_s[state_floats:], "state past state_floats")
    ref.assert_untouched(got_h[hist_floats:], "history past hist_floats")
