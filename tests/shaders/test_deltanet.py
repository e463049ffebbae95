"""shaders/deltanet.metal: the Gated DeltaNet core (conv + norms + gates + scan + the gated
norm's elementwise part in one kernel, with the history-ring store in decode and verify steps;
prefill's per-head norm factor + ring store; state restore) against float64 numpy written
from docs/design.md, "Gated DeltaNet".

Outputs start as NaN and are followed by NaN guard rows/planes, the inputs' row padding
is NaN too (so a wrong stride reads NaN into the result), and so is every history-ring
slot a step must not read. Shapes use n_k != n_v (2 and 6: v-head h reads k-head h // 3,
so a tiled mapping fails) and rows 1, 7, 33 (33 > the ring's slots); the conv runs with
K = 4, 2 and 1, at positions past the history and inside it (zero padding); one
27B-sized shape (16 k / 48 v heads, 10240 channels). The references are generic in
d_k, d_v and are themselves checked with d_k != d_v; the scan test also shows that a
transposed state layout would fail.

Tolerances (relative to the largest reference value unless stated):
- TOL_FAST = 2e-5 for paths through exp/rsqrt: Metal's fast-math exp is within
  (3 + 2|x|) ulp (<= 4e-6 for |x| <= 30), rsqrt 2 ulp; K-term f32 conv sums and the
  128-term f32 norm sums add ~1e-7. The CPU runtime (libm) lands near 1e-7.
- TOL_SCAN = 1e-5 for the scan's y and state: f32 recurrence with 128-term dots; the
  update contracts (decay <= 1, |k| = 1, beta < 1), so errors do not grow with rows
  (a float32 simulation stays near 3e-7 normwise over 33 rows). The kernel leaves
  g = y * w * silu(z); y is recovered as g / (w * silu(z)) in float64, which adds silu's
  fast-math exp (TOL_FAST) elementwise; the partial sums of y^2 carry twice y's error.
- Gates elementwise: decay within 1e-5 (1 + x) relative, x = exp(A_log) softplus(.)
  the exponent (an f32 rounding of x moves exp(-x) by x ulp, and fast-math exp adds
  (3 + 2x) ulp); beta within 1e-5 (1 + |b|) relative, for the same reason.
- Copies (history, snapshots, restore) are exact.
"""

import numpy as np
import pytest

from ..support import reference as ref
from .deltanet_reference import (
    D, HEAD_PARTIALS, NORM_PARAMS, NORM_SIMDGROUPS, RESTORE_PARAMS, SCAN_PARAMS, SCAN_ROWS, SCAN_SIMDGROUPS,
    SCAN_THREADS, channels, conv_inputs, conv_ref, gate_inputs, gated_norm_ref, gates_ref, head_partials_ref, pack,
    qk_norm_ref, scan_ref, seeded, silu)
from .params import step_segments

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
# delta_conv_scan: conv + silu + q/k norms + gates + scan + gated output (g, y^2 partials)
# + state snapshots (+ the history ring with store_history)


def ring_with(hist, position, slots, c):
    """A history ring [slots][C] holding hist's rows (positions position-K+1 .. position-1,
    oldest first) at slot p % slots; every other slot (and positions before 0) NaN."""
    ring = np.full((slots, c), np.nan, np.float32)
    km1 = hist.shape[0]
    for i in range(km1):
        p = position - km1 + i
        if p >= 0:
            ring[p % slots] = hist[i]
    return ring


def effective_history(hist, position):
    """The history the math sees: positions before the sequence are zero."""
    km1 = hist.shape[0]
    out = np.array(hist, np.float64, copy=True)
    out[:max(0, km1 - position)] = 0.0
    return out


def scan_state(rng, n_v):
    state = (rng.standard_normal((n_v, D, D)) * 0.1).astype(np.float32)
    state[:, :, :7] += 0.5  # columns (dk) differ from rows (dv): a transposed state shows
    return state


def norm_weight_bits(rng):
    return ref.bf16_bits(rng.uniform(0.5, 1.5, D).astype(np.float32))


def gate_values(rng, rows, n_v):
    return (rng.standard_normal((rows, n_v * D)) * 2.0).astype(np.float32)


def run_conv_scan(dev, lib, *, x, w_bits, hist, a, b, a_log, dt_bias, z, norm_bits, state, n_k, n_v, snap_rows,
                  position=20, slots=None, simdgroups=SCAN_SIMDGROUPS, alog_bf16=False, wf32=False, norm_f32=None,
                  store=False):
    """delta_conv_scan; ``wf32``: the *_wf32 variant, given the same conv/dt_bias values as f32;
    ``norm_f32`` (default: wf32): the norm weight as f32 (flag norm_f32); ``store``: store_history
    (checked: exactly the step's rows land in the ring, else none).
    Returns (g [rows][n_v][D], partials [rows][n_v][HEAD_PARTIALS], state, snapshots
    [snap_rows][n_v][D][D])."""
    rows, c = x.shape
    ksize = w_bits.shape[1]
    slots = slots or ksize - 1 + 8
    x_stride, ab_stride, z_stride = c + 8, n_v + 3, n_v * D + 4
    ss_stride = n_v * HEAD_PARTIALS + 4
    plane = n_v * D * D
    snap_stride = plane + 8
    ring = ring_with(hist, position, slots, c)
    ring_b = dev.buffer(ring.reshape(-1).copy())
    st = dev.buffer(state.reshape(-1).copy())
    out = nan_buffer(dev, rows + 1, n_v * D)
    ss = nan_buffer(dev, rows + 1, ss_stride)
    snaps = nan_buffer(dev, (snap_rows + 1) * snap_stride)
    alog_buf = dev.buffer(ref.bf16_bits(a_log).astype(BF16) if alog_bf16 else a_log.astype(np.float32))
    norm_f32 = wf32 if norm_f32 is None else norm_f32
    params = pack(SCAN_PARAMS, n_k=n_k, n_v=n_v, ksize=ksize, hist_slots=slots, snap_rows=snap_rows,
                  store_history=int(store), x_stride=x_stride, ab_stride=ab_stride, z_stride=z_stride,
                  ss_stride=ss_stride, state_snap_stride=snap_stride, state_slot_stride=plane,
                  hist_slot_stride=slots * c, snap_slot_stride=(snap_rows + 1) * snap_stride, norm_f32=int(norm_f32),
                  qk_eps=QK_EPS)
    kernel = lib.kernel(("delta_conv_scan_alog_bf16" if alog_bf16 else "delta_conv_scan_alog_f32") +
                        ("_wf32" if wf32 else ""))

    def vector(bits, f32=wf32):
        return dev.buffer(ref.bf16_to_f32(bits) if f32 else bits.astype(BF16))

    groups = -(-n_v * (D // SCAN_ROWS) // simdgroups)
    kernel.dispatch({0: dev.buffer(padded(x, x_stride)), 1: vector(w_bits), 2: ring_b, 3: dev.buffer(padded(a, ab_stride)),
                     4: dev.buffer(padded(b, ab_stride)), 5: alog_buf, 6: vector(dt_bias),
                     7: dev.buffer(padded(z, z_stride)), 8: vector(norm_bits, norm_f32), 9: st, 10: out, 11: ss, 12: snaps,
                     13: step_segments((0, rows, position)), 14: params},
                    threadgroups=(groups, 1), threads=(32 * simdgroups,))
    got = out.numpy(np.float32, (rows + 1, n_v * D))
    ref.assert_untouched(got[rows], "out past the last row")
    got_ss = ss.numpy(np.float32, (rows + 1, ss_stride))
    ref.assert_untouched(got_ss[:, n_v * HEAD_PARTIALS:], "partials' row padding")
    ref.assert_untouched(got_ss[rows], "partials past the last row")
    raw = snaps.numpy(np.float32)
    for t in range(snap_rows):
        ref.assert_untouched(raw[t * snap_stride + plane:(t + 1) * snap_stride], f"snapshot padding after plane {t}")
    ref.assert_untouched(raw[snap_rows * snap_stride:], "snapshot planes past snap_rows")
    got_snaps = np.stack([raw[t * snap_stride:t * snap_stride + plane].reshape(n_v, D, D) for t in range(snap_rows)]) \
        if snap_rows else np.zeros((0, n_v, D, D), np.float32)
    want_ring = ring.copy()
    if store:
        for t in range(rows):
            want_ring[(position + t) % slots] = x[t]
    got_ring = ring_b.numpy(np.float32, (slots, c))
    np.testing.assert_array_equal(got_ring.view(np.uint32), want_ring.view(np.uint32),
                                  err_msg="ring after the scan" + (" (store_history)" if store else ""))
    return (got[:rows].reshape(rows, n_v, D), got_ss[:rows, :n_v * HEAD_PARTIALS].reshape(rows, n_v, HEAD_PARTIALS),
            st.numpy(np.float32, (n_v, D, D)), got_snaps)


def conv_scan_reference(*, x, w_bits, hist, a, b, a_log, dt_bias, state, n_k, n_v, position=20, alog_bf16=False,
                        **_):
    """(y, final state, state after each row) from the math of docs/design.md, "Gated DeltaNet", in float64."""
    rows = x.shape[0]
    y, _, _ = conv_ref(x, ref.bf16_to_f32(w_bits), effective_history(hist, position))
    q, k, v = qk_norm_ref(y, n_k, D, QK_EPS)
    alog = ref.round_bf16(a_log) if alog_bf16 else a_log
    decay, beta, _ = gates_ref(a, b, alog, ref.bf16_to_f32(dt_bias))
    return scan_ref(q, k, v.reshape(rows, n_v, D), decay, beta, state)


def recovered_y(g, z, norm_bits):
    """The scan's y from its gated output g = y * w * silu(z), in float64."""
    rows, n_v, _ = g.shape
    return np.asarray(g, np.float64) / (ref.bf16_to_f32(norm_bits).astype(np.float64) * silu(z.reshape(rows, n_v, D)))


def conv_scan_inputs(rng, rows, n_k, n_v, ksize):
    x, w_bits, hist = conv_inputs(rng, rows, n_k, n_v, ksize)
    a, b, a_log, dt_bias = gate_inputs(rng, rows, n_v)
    return dict(x=x, w_bits=w_bits, hist=hist, a=a, b=b, a_log=a_log, dt_bias=dt_bias, z=gate_values(rng, rows, n_v),
                norm_bits=norm_weight_bits(rng), state=scan_state(rng, n_v), n_k=n_k, n_v=n_v)


def assert_scan_matches(got, inputs, rows, what, position=20, alog_bf16=False):
    """run_conv_scan's results against the float64 reference."""
    g, partials, s, snaps = got
    want_y, want_s, want_after = conv_scan_reference(**inputs, position=position, alog_bf16=alog_bf16)
    y = recovered_y(g, inputs["z"], inputs["norm_bits"])
    ref.assert_close(y, want_y, TOL_SCAN + 2 * TOL_FAST, f"{what}: y (from g)")
    ref.assert_close(partials, head_partials_ref(want_y), 2 * (TOL_SCAN + TOL_FAST), f"{what}: partials of y^2")
    ref.assert_close(s, want_s, TOL_SCAN + TOL_FAST, f"{what}: state")
    ref.assert_close(snaps, want_after[:len(snaps)], TOL_SCAN + TOL_FAST, f"{what}: snapshots")
    return y


SCAN_CASES = [(ksize, rows, position) for ksize in (4, 2) for rows in (1, 7, 33) for position in (20,)] + \
             [(1, 7, 20), (4, 7, 0), (4, 1, 2)]


@pytest.mark.parametrize("ksize,rows,position", SCAN_CASES)
def test_conv_scan_outputs_state_and_snapshots(dev, lib, ksize, rows, position):
    rng = seeded("conv-scan", ksize, rows, position)
    inputs = conv_scan_inputs(rng, rows, 2, 6, ksize)
    alog_bf16 = rows == 7  # both A_log variants across the cases
    store = rows <= 8 and position > 0  # the ring store of decode and verify steps, where it fits
    got = run_conv_scan(dev, lib, **inputs, snap_rows=rows - 1, position=position, alog_bf16=alog_bf16, store=store)
    what = f"K={ksize} rows={rows} position={position}"
    y = assert_scan_matches(got, inputs, rows, what, position, alog_bf16)
    # The same check would catch a kernel that keeps the state transposed ([dk][dv]) ...
    alt = dict(inputs, state=inputs["state"].transpose(0, 2, 1))
    assert ref.rel_err(y, conv_scan_reference(**alt, position=position, alog_bf16=alog_bf16)[0]) > 100 * TOL_SCAN
    # ... or that ignores the history (or reads it where the sequence has none).
    if ksize > 1 and position > 0:
        cold = dict(inputs, hist=np.zeros_like(inputs["hist"]))
        assert ref.rel_err(y[0], conv_scan_reference(**cold, position=position, alog_bf16=alog_bf16)[0][0]) > 1e-3


@pytest.mark.parametrize("simdgroups", [1, 3, 16])
def test_conv_scan_any_threadgroup_size_gives_identical_results(dev, lib, simdgroups):
    """Every SIMD-group works alone, so the threadgroup size (3: the last threadgroup
    has SIMD-groups past the last block) changes no bit."""
    inputs = conv_scan_inputs(seeded("conv-scan-sg"), 8, 2, 6, 4)
    base = run_conv_scan(dev, lib, **inputs, snap_rows=4, store=True)
    other = run_conv_scan(dev, lib, **inputs, snap_rows=4, simdgroups=simdgroups, store=True)
    for g, o, name in zip(base, other, ("g", "partials", "state", "snapshots")):
        np.testing.assert_array_equal(o, g, err_msg=f"{name} differs with {simdgroups} simdgroups")


def test_conv_scan_27b(dev, lib):
    inputs = conv_scan_inputs(seeded("conv-scan-27b"), 3, 16, 48, 4)
    assert channels(16, 48) == 10240
    assert_scan_matches(run_conv_scan(dev, lib, **inputs, snap_rows=2, store=True), inputs, 3, "27B")


def test_conv_scan_declares_its_threadgroup_size(dev, lib):
    assert lib.kernel("delta_conv_scan_alog_f32").max_threads_per_threadgroup <= SCAN_THREADS


# ---------------------------------------------------------------------------
# delta_norm_history (prefill): the gated norm's per-head factor in place + the history ring


def run_norm_history(dev, lib, *, g, partials, x, ring, position, simdgroups=NORM_SIMDGROUPS):
    rows, n_v, _ = g.shape
    slots, c = ring.shape
    n_k = (c - n_v * D) // (2 * D)
    x_stride, ss_stride = c + 4, n_v * HEAD_PARTIALS + 8
    out = dev.buffer(np.concatenate([g.reshape(rows, -1), np.full((1, n_v * D), np.nan, np.float32)]))
    ring_b = dev.buffer(ring.reshape(-1).copy())
    params = pack(NORM_PARAMS, n_k=n_k, n_v=n_v, hist_slots=slots, x_stride=x_stride, ss_stride=ss_stride,
                  hist_slot_stride=slots * c, norm_eps=NORM_EPS)
    lib.kernel("delta_norm_history").dispatch(
        {0: dev.buffer(padded(x, x_stride)), 1: dev.buffer(padded(partials.reshape(rows, -1), ss_stride)), 2: out,
         3: ring_b, 4: step_segments((0, rows, position)), 5: params},
        threadgroups=(n_v + c // D, 1), threads=(32 * simdgroups,))
    got = out.numpy(np.float32, (rows + 1, n_v * D))
    ref.assert_untouched(got[rows], "out past the last row")
    return got[:rows].reshape(rows, n_v, D), ring_b.numpy(np.float32, (slots, c))


def norm_inputs(rng, rows, n_k, n_v, slots):
    """The scan's outputs for y, z, w (g = y * w * silu(z) and y's partials, f32) with x and a ring."""
    c = channels(n_k, n_v)
    y = (rng.standard_normal((rows, n_v, D)) * 0.3).astype(np.float32)
    z = gate_values(rng, rows, n_v).reshape(rows, n_v, D)
    w = ref.bf16_to_f32(norm_weight_bits(rng))
    g = (y.astype(np.float64) * w * silu(z)).astype(np.float32)
    partials = head_partials_ref(y).astype(np.float32)
    x = rng.standard_normal((rows, c)).astype(np.float32)
    ring = rng.standard_normal((slots, c)).astype(np.float32)
    return dict(g=g, partials=partials, x=x, ring=ring), (y, z, w)


@pytest.mark.parametrize("rows,position", [(1, 0), (1, 37), (7, 9), (33, 5)])
def test_norm_history(dev, lib, rows, position):
    n_k, n_v, slots = 2, 6, 11
    inputs, (y, z, w) = norm_inputs(seeded("norm-history", rows, position), rows, n_k, n_v, slots)
    out, ring = run_norm_history(dev, lib, **inputs, position=position)
    ref.assert_close(out, gated_norm_ref(y, z, w, NORM_EPS), TOL_FAST, f"rows={rows}: gated norm")
    # A factor over the whole row instead of per head is far outside the tolerance.
    whole_row = y.reshape(rows, 1, -1)
    assert ref.rel_err(out, gated_norm_ref(whole_row, z.reshape(rows, 1, -1), np.tile(w, n_v), NORM_EPS)
                       .reshape(rows, n_v, D)) > 0.01
    # The last min(rows, slots) rows land at their positions' slots, exactly; no other slot moves.
    want_ring = inputs["ring"].copy()
    for t in range(max(0, rows - slots), rows):
        want_ring[(position + t) % slots] = inputs["x"][t]
    np.testing.assert_array_equal(ring, want_ring, err_msg=f"rows={rows}: history ring")


@pytest.mark.parametrize("simdgroups", [1, 3])
def test_norm_history_any_threadgroup_size_gives_identical_results(dev, lib, simdgroups):
    inputs, _ = norm_inputs(seeded("norm-sg"), 7, 2, 6, 11)
    base = run_norm_history(dev, lib, **inputs, position=4)
    other = run_norm_history(dev, lib, **inputs, position=4, simdgroups=simdgroups)
    for g, o, name in zip(base, other, ("out", "ring")):
        np.testing.assert_array_equal(o, g, err_msg=f"{name} differs with {simdgroups} simdgroups")


@pytest.mark.parametrize("wf32,norm_f32", [(True, True), (False, True), (True, False)])
def test_f32_vectors_give_the_bf16_bits(dev, lib, wf32, norm_f32):
    """delta_conv_scan_alog_f32_wf32 (f32 conv and dt_bias, as f32 or f16 checkpoints give them)
    and the norm_f32 flag (an f32 norm weight), together or apart, reproduce the bf16 kernel bit
    for bit."""
    inputs = conv_scan_inputs(seeded("wf32"), 7, 2, 6, 4)
    for got, want in zip(run_conv_scan(dev, lib, **inputs, snap_rows=3, wf32=wf32, norm_f32=norm_f32),
                         run_conv_scan(dev, lib, **inputs, snap_rows=3)):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------------------
# The layer as the engine encodes it in one command buffer (decode/verify: the scan alone,
# storing the ring; prefill: the scan, then delta_norm_history), speculative rollback, and
# rows-at-once == row-by-row (bit for bit)


class Layer:
    """One DeltaNet layer's buffers and its dispatches (plus restore), at a position."""

    def __init__(self, dev, lib, rng, n_k, n_v, ksize, max_rows, position=0):
        self.dev, self.lib, self.n_k, self.n_v, self.ksize = dev, lib, n_k, n_v, ksize
        self.c = channels(n_k, n_v)
        self.slots = ksize - 1 + max(8, max_rows)  # the engine's ring: K-1 + the rows of its deepest step
        self.position = position
        _, w_bits, hist = conv_inputs(rng, 1, n_k, n_v, ksize)
        _, _, a_log, dt_bias = gate_inputs(rng, 1, n_v)
        self.conv_w = dev.buffer(w_bits.astype(BF16))
        self.a_log = dev.buffer(a_log)
        self.dt_bias = dev.buffer(dt_bias.astype(BF16))
        self.norm_w = dev.buffer(norm_weight_bits(rng).astype(BF16))
        self.hist = dev.buffer(ring_with(hist, position, self.slots, self.c))
        self.state = dev.buffer((rng.standard_normal((n_v, D, D)) * 0.1).astype(np.float32))
        self.state_plane = n_v * D * D
        self.max_rows = max_rows
        self.state_snaps = nan_buffer(dev, max_rows * self.state_plane)

    def step(self, x, a, b, z, snap_rows=0, prefill=False):
        """A decode/verify step (rows <= slots - (K-1)): [rows][g | partials of y^2]; a prefill step: the
        normalised rows [rows][n_v * D]."""
        dev, rows = self.dev, x.shape[0]
        ss_stride = self.n_v * HEAD_PARTIALS
        out, ss = nan_buffer(dev, rows, self.n_v * D), nan_buffer(dev, rows, ss_stride)
        scan_p = pack(SCAN_PARAMS, n_k=self.n_k, n_v=self.n_v, ksize=self.ksize, hist_slots=self.slots,
                      snap_rows=snap_rows, store_history=int(not prefill), x_stride=self.c, ab_stride=self.n_v,
                      z_stride=self.n_v * D, ss_stride=ss_stride, state_snap_stride=self.state_plane,
                      state_slot_stride=self.state_plane, hist_slot_stride=self.slots * self.c,
                      snap_slot_stride=self.max_rows * self.state_plane, norm_f32=0, qk_eps=QK_EPS)
        norm_p = pack(NORM_PARAMS, n_k=self.n_k, n_v=self.n_v, hist_slots=self.slots, x_stride=self.c,
                      ss_stride=ss_stride, hist_slot_stride=self.slots * self.c, norm_eps=NORM_EPS)
        segs = step_segments((0, rows, self.position))
        xb = dev.buffer(x)
        cb = dev.command_buffer()
        cb.dispatch(self.lib.kernel("delta_conv_scan_alog_f32"),
                    {0: xb, 1: self.conv_w, 2: self.hist, 3: dev.buffer(a), 4: dev.buffer(b), 5: self.a_log,
                     6: self.dt_bias, 7: dev.buffer(z), 8: self.norm_w, 9: self.state, 10: out, 11: ss,
                     12: self.state_snaps, 13: segs, 14: scan_p},
                    (-(-self.n_v * (D // SCAN_ROWS) // SCAN_SIMDGROUPS), 1), (32 * SCAN_SIMDGROUPS,))
        if prefill:
            cb.barrier()
            cb.dispatch(self.lib.kernel("delta_norm_history"), {0: xb, 1: ss, 2: out, 3: self.hist, 4: segs, 5: norm_p},
                        (self.n_v + self.c // D, 1), (32 * NORM_SIMDGROUPS,))
        cb.commit()
        cb.wait()
        self.position += rows
        got = out.numpy(np.float32, (rows, self.n_v * D))
        return got if prefill else np.concatenate([got, ss.numpy(np.float32, (rows, ss_stride))], axis=1)

    def restore(self, plane, planes):
        p = pack(RESTORE_PARAMS, state_floats=self.state_plane, state_snap_stride=self.state_plane, planes=planes)
        self.lib.kernel("delta_restore").dispatch_threads(
            {0: self.state, 1: self.state_snaps, 2: self.dev.buffer(np.array([plane], np.uint32)), 3: p},
            grid=(self.state_plane // 4,), threads=(64,))

    def snapshot(self):
        """The state, and the history the next step reads (positions position-K+1 .. position-1)."""
        ring = self.hist.numpy(np.float32, (self.slots, self.c))
        read = [ring[p % self.slots] for p in range(self.position - self.ksize + 1, self.position) if p >= 0]
        return self.state.numpy(np.float32).copy(), np.array(read)


def layer_inputs(rng, rows, n_k, n_v):
    x, _, _ = conv_inputs(rng, rows, n_k, n_v, 2)
    a, b, _, _ = gate_inputs(rng, rows, n_v)
    z = (rng.standard_normal((rows, n_v * D)) * 2.0).astype(np.float32)
    return x, a, b, z


@pytest.mark.parametrize("position", [0, 30])
def test_layer_rows_at_once_equal_row_by_row_bitwise(dev, lib, position):
    """Verify rows must reproduce decode rows exactly (speculative decoding relies on it)."""
    n_k, n_v, ksize, rows = 2, 6, 4, 7
    x, a, b, z = layer_inputs(seeded("layer-inputs"), rows, n_k, n_v)
    batched = Layer(dev, lib, seeded("layer"), n_k, n_v, ksize, rows, position)
    single = Layer(dev, lib, seeded("layer"), n_k, n_v, ksize, rows, position)
    out_b = batched.step(x, a, b, z, snap_rows=rows - 1)
    for t in range(rows):
        out_1 = single.step(x[t:t + 1], a[t:t + 1], b[t:t + 1], z[t:t + 1])
        np.testing.assert_array_equal(out_1[0], out_b[t], err_msg=f"output row {t}")
    for got, want, name in zip(batched.snapshot(), single.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=name)
    # A prefill step of the same rows (the ring stored after the scan) leaves the same state and history.
    prefilled = Layer(dev, lib, seeded("layer"), n_k, n_v, ksize, rows, position)
    prefilled.step(x, a, b, z, prefill=True)
    for got, want, name in zip(prefilled.snapshot(), single.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} after a prefill step")


def test_layer_prefill_longer_than_the_ring_then_decode(dev, lib):
    """A prefill of more rows than the ring has slots keeps the last ones: decoding after
    it equals decoding after the same rows fed in two steps."""
    n_k, n_v, ksize = 2, 6, 4
    x, a, b, z = layer_inputs(seeded("prefill-inputs"), 30, n_k, n_v)
    whole = Layer(dev, lib, seeded("prefill"), n_k, n_v, ksize, 1, 3)
    split = Layer(dev, lib, seeded("prefill"), n_k, n_v, ksize, 1, 3)
    out_w = whole.step(x, a, b, z, prefill=True)
    out_s = np.concatenate([split.step(x[:13], a[:13], b[:13], z[:13], prefill=True),
                            split.step(x[13:], a[13:], b[13:], z[13:], prefill=True)])
    np.testing.assert_array_equal(out_w, out_s)
    x2, a2, b2, z2 = layer_inputs(seeded("prefill-next"), 1, n_k, n_v)
    np.testing.assert_array_equal(whole.step(x2, a2, b2, z2), split.step(x2, a2, b2, z2))


@pytest.mark.parametrize("accepted", [1, 3, 5, 6])
def test_layer_restore_equals_running_only_the_accepted_rows(dev, lib, accepted):
    """Rollback restores the state; the history ring needs nothing (the rejected rows'
    slots are rewritten before any step reads them)."""
    n_k, n_v, ksize, rows = 2, 6, 4, 6
    x, a, b, z = layer_inputs(seeded("restore-inputs"), rows, n_k, n_v)
    spec = Layer(dev, lib, seeded("restore"), n_k, n_v, ksize, rows, 17)
    plain = Layer(dev, lib, seeded("restore"), n_k, n_v, ksize, rows, 17)
    spec.step(x, a, b, z, snap_rows=rows - 1)
    spec.restore(accepted - 1, planes=rows - 1)  # keep rows 0 .. accepted-1 (all rows: no copy)
    spec.position -= rows - accepted
    plain.step(x[:accepted], a[:accepted], b[:accepted], z[:accepted])
    for got, want, name in zip(spec.snapshot(), plain.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} after restoring plane {accepted - 1}")
    # And decoding continues identically from the restored state.
    for seed in range(3):
        x2, a2, b2, z2 = layer_inputs(seeded("restore-next", seed), 1, n_k, n_v)
        np.testing.assert_array_equal(spec.step(x2, a2, b2, z2), plain.step(x2, a2, b2, z2))


@pytest.mark.parametrize("accepted", [1, 9, 17])
def test_deep_verify_rows_equal_row_by_row_and_roll_back(dev, lib, accepted):
    """A deep verify step (16 drafts + 1: 17 rows, a ring of K-1+17 slots, 16 snapshot planes)
    gives each kept row decode's bits, and the rollback to `accepted` rows leaves state and ring
    as running only those rows; decoding then continues identically."""
    n_k, n_v, ksize, rows = 2, 2, 4, 17
    x, a, b, z = layer_inputs(seeded("deep-inputs"), rows, n_k, n_v)
    spec = Layer(dev, lib, seeded("deep"), n_k, n_v, ksize, rows, 40)
    plain = Layer(dev, lib, seeded("deep"), n_k, n_v, ksize, rows, 40)
    out = spec.step(x, a, b, z, snap_rows=rows - 1)
    for t in range(accepted):
        np.testing.assert_array_equal(plain.step(x[t:t + 1], a[t:t + 1], b[t:t + 1], z[t:t + 1])[0], out[t],
                                      err_msg=f"output row {t}")
    spec.restore(accepted - 1, planes=rows - 1)
    spec.position -= rows - accepted
    for got, want, name in zip(spec.snapshot(), plain.snapshot(), ("state", "history")):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} after restoring plane {accepted - 1}")
    x2, a2, b2, z2 = layer_inputs(seeded("deep-next"), 3, n_k, n_v)
    np.testing.assert_array_equal(spec.step(x2, a2, b2, z2), plain.step(x2, a2, b2, z2))


def test_restore_copies_exactly_the_plane_and_nothing_else(dev, lib):
    rng = seeded("restore-only")
    state_floats, planes = 3 * 128, 3
    s_stride = state_floats + 12
    state_snaps = rng.standard_normal(planes * s_stride).astype(np.float32)
    state = nan_buffer(dev, state_floats + 8)
    p = pack(RESTORE_PARAMS, state_floats=state_floats, state_snap_stride=s_stride, planes=planes)
    for plane, grid in ((2, state_floats // 4 + 5), (planes, state_floats // 4)):
        lib.kernel("delta_restore").dispatch_threads(
            {0: state, 1: dev.buffer(state_snaps), 2: dev.buffer(np.array([plane], np.uint32)), 3: p},
            grid=(grid,), threads=(32,))
    got = state.numpy(np.float32)
    np.testing.assert_array_equal(got[:state_floats], state_snaps[2 * s_stride:2 * s_stride + state_floats])
    ref.assert_untouched(got[state_floats:], "state past state_floats")


# ---------------------------------------------------------------------------
# Several sequences in one step (StepSegments): each segment reads and writes only its slot's
# state, ring and snapshots, and its rows come out exactly as with the segment alone.


class SlotLayer:
    """One DeltaNet layer's per-slot buffers ([slots][...] with padded strides, padding NaN)
    and a step of any segments over them: the scan storing the ring (decode/verify), or the
    scan then the factor + ring store (prefill)."""

    def __init__(self, dev, lib, rng, n_k, n_v, ksize, n_slots, snap_rows):
        self.dev, self.lib, self.n_k, self.n_v, self.ksize, self.snap_rows = dev, lib, n_k, n_v, ksize, snap_rows
        self.c = channels(n_k, n_v)
        self.hist_slots = ksize - 1 + 8
        self.plane = n_v * D * D
        # Strides past each slot's data (multiples of 4 floats): a slot mix-up reads NaN or leaves a trace.
        self.state_stride = self.plane + 4
        self.hist_stride = self.hist_slots * self.c + 8
        self.snap_stride = max(snap_rows, 1) * self.plane + 4
        _, w_bits, _ = conv_inputs(rng, 1, n_k, n_v, ksize)
        _, _, self.a_log, dt_bias = gate_inputs(rng, 1, n_v)
        self.w_bits, self.dt_bias = w_bits, dt_bias
        self.norm_bits = norm_weight_bits(rng)
        self.state = np.full((n_slots, self.state_stride), np.nan, np.float32)
        self.hist = np.full((n_slots, self.hist_stride), np.nan, np.float32)
        self.snaps = np.full((n_slots, self.snap_stride), np.nan, np.float32)
        self.slot_hist = {}
        for s in range(n_slots):
            self.state[s, :self.plane] = scan_state(rng, n_v).reshape(-1)

    def set_history(self, slot, position, hist):
        """Slot's ring holding hist (positions position-K+1 .. position-1), other ring slots NaN."""
        self.hist[slot, :self.hist_slots * self.c] = ring_with(hist, position, self.hist_slots, self.c).reshape(-1)
        self.slot_hist[slot] = hist

    def step(self, segments, x, a, b, z, prefill):
        """segments [(slot, rows, position)], rows laid out in order. Returns (g, partials, out, state,
        hist, snaps) after the step: the scan's outputs, the normalised rows (prefill; else g), buffers
        [slots][stride]."""
        dev, rows = self.dev, x.shape[0]
        ss_stride = self.n_v * HEAD_PARTIALS
        segs = step_segments(*segments)
        scan_p = pack(SCAN_PARAMS, n_k=self.n_k, n_v=self.n_v, ksize=self.ksize, hist_slots=self.hist_slots,
                      snap_rows=self.snap_rows, store_history=int(not prefill), x_stride=self.c, ab_stride=self.n_v,
                      z_stride=self.n_v * D, ss_stride=ss_stride, state_snap_stride=self.plane,
                      state_slot_stride=self.state_stride, hist_slot_stride=self.hist_stride,
                      snap_slot_stride=self.snap_stride, norm_f32=0, qk_eps=QK_EPS)
        norm_p = pack(NORM_PARAMS, n_k=self.n_k, n_v=self.n_v, hist_slots=self.hist_slots, x_stride=self.c,
                      ss_stride=ss_stride, hist_slot_stride=self.hist_stride, norm_eps=NORM_EPS)
        xb, out, ss = dev.buffer(x), nan_buffer(dev, rows + 1, self.n_v * D), nan_buffer(dev, rows + 1, ss_stride)
        st, hist, snaps = dev.buffer(self.state.copy()), dev.buffer(self.hist.copy()), dev.buffer(self.snaps.copy())
        self.lib.kernel("delta_conv_scan_alog_f32").dispatch(
            {0: xb, 1: dev.buffer(self.w_bits.astype(BF16)), 2: hist, 3: dev.buffer(a), 4: dev.buffer(b),
             5: dev.buffer(self.a_log), 6: dev.buffer(self.dt_bias.astype(BF16)), 7: dev.buffer(z),
             8: dev.buffer(self.norm_bits.astype(BF16)), 9: st, 10: out, 11: ss, 12: snaps, 13: segs, 14: scan_p},
            threadgroups=(-(-self.n_v * (D // SCAN_ROWS) // SCAN_SIMDGROUPS), len(segments)),
            threads=(32 * SCAN_SIMDGROUPS,))
        g = out.numpy(np.float32, (rows + 1, self.n_v * D)).copy()
        partials = ss.numpy(np.float32, (rows + 1, ss_stride))
        ref.assert_untouched(partials[rows], "partials past the step's rows")
        if prefill:
            self.lib.kernel("delta_norm_history").dispatch(
                {0: xb, 1: ss, 2: out, 3: hist, 4: segs, 5: norm_p},
                threadgroups=(self.n_v + self.c // D, len(segments)), threads=(32 * NORM_SIMDGROUPS,))
        got = out.numpy(np.float32, (rows + 1, self.n_v * D))
        ref.assert_untouched(got[rows], "out past the step's rows")
        shape = self.state.shape
        return (g[:rows], partials[:rows], got[:rows], st.numpy(np.float32, shape),
                hist.numpy(np.float32, self.hist.shape), snaps.numpy(np.float32, self.snaps.shape))


# (slot, rows, position): slots out of order and not adjacent, a sequence's first rows
# (position 0: no history), a long one, one row and several rows.
SEGMENT_CASES = {
    "two": [(2, 3, 200), (0, 1, 0)],
    "three": [(3, 1, 37), (1, 5, 2), (0, 2, 130)],
    "four": [(0, 1, 5), (3, 4, 0), (1, 1, 300), (4, 3, 64)],
}


@pytest.mark.parametrize("prefill", [False, True], ids=["scan-stores", "prefill"])
@pytest.mark.parametrize("case", sorted(SEGMENT_CASES))
def test_segments_equal_each_segment_alone_bitwise(dev, lib, case, prefill):
    """A step of several sequences gives each one's rows, state, ring and snapshots exactly as
    the sequence alone, touches no other slot and no byte between slots; the sequence alone
    (in a slot other than 0) matches the float64 reference."""
    segments = SEGMENT_CASES[case]
    n_k, n_v, ksize, snap_rows = 2, 6, 4, 2
    n_slots = max(s for s, _, _ in segments) + 2  # the last slot is never used
    rng = seeded("segments", case)
    layer = SlotLayer(dev, lib, rng, n_k, n_v, ksize, n_slots, snap_rows)
    per_seg = []
    for slot, rows, position in segments:
        x, _, hist = conv_inputs(rng, rows, n_k, n_v, ksize)
        a, b, _, _ = gate_inputs(rng, rows, n_v)
        layer.set_history(slot, position, hist)
        per_seg.append((x, a, b, gate_values(rng, rows, n_v)))
    together = layer.step(segments, *(np.concatenate(parts) for parts in zip(*per_seg)), prefill)
    g_all, ss_all, out_all, state_all, hist_all, snaps_all = together
    used = [slot for slot, _, _ in segments]
    ends = {"state": layer.plane, "ring": layer.hist_slots * layer.c, "snapshots": snap_rows * layer.plane}
    for name, got, before in (("state", state_all, layer.state), ("ring", hist_all, layer.hist),
                              ("snapshots", snaps_all, layer.snaps)):
        for slot in range(n_slots):  # unused slots whole, used ones past their data
            start = ends[name] if slot in used else 0
            np.testing.assert_array_equal(got[slot, start:].view(np.uint32), before[slot, start:].view(np.uint32),
                                          err_msg=f"{name} of slot {slot} from {start}")
    first = 0
    for i, (slot, rows, position) in enumerate(segments):
        what = f"segment {i} (slot {slot}, rows {rows}, position {position})"
        alone = layer.step([(slot, rows, position)], *per_seg[i], prefill)
        g_1, ss_1, out_1, state_1, hist_1, snaps_1 = alone
        rows_of = slice(first, first + rows)
        for name, got, want in (("g", g_all[rows_of], g_1), ("partials", ss_all[rows_of], ss_1),
                                ("out", out_all[rows_of], out_1), ("state", state_all[slot], state_1[slot]),
                                ("ring", hist_all[slot], hist_1[slot]), ("snapshots", snaps_all[slot], snaps_1[slot])):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{what}: {name}")
        for other in range(n_slots):  # alone, it touches its slot only
            if other != slot:
                for name, got, before in (("state", state_1, layer.state), ("ring", hist_1, layer.hist),
                                          ("snapshots", snaps_1, layer.snaps)):
                    np.testing.assert_array_equal(got[other].view(np.uint32), before[other].view(np.uint32),
                                                  err_msg=f"{what} alone: {name} of slot {other}")
        x, a, b, z = per_seg[i]
        inputs = dict(x=x, w_bits=layer.w_bits, hist=layer.slot_hist[slot], a=a, b=b, a_log=layer.a_log,
                      dt_bias=layer.dt_bias, z=z, norm_bits=layer.norm_bits,
                      state=layer.state[slot, :layer.plane].reshape(n_v, D, D), n_k=n_k, n_v=n_v)
        kept = min(snap_rows, rows - 1)  # a segment's last row is never rolled back to
        snaps = snaps_1[slot, :kept * layer.plane].reshape(kept, n_v, D, D)
        state = state_1[slot, :layer.plane].reshape(n_v, D, D)
        got = (g_1.reshape(rows, n_v, D), ss_1[:, :n_v * HEAD_PARTIALS].reshape(rows, n_v, HEAD_PARTIALS), state, snaps)
        y = assert_scan_matches(got, inputs, rows, what, position)
        if prefill:
            want = gated_norm_ref(y, z.reshape(rows, n_v, D), ref.bf16_to_f32(layer.norm_bits), NORM_EPS)
            ref.assert_close(out_1.reshape(rows, n_v, D), want, TOL_FAST, f"{what}: normalised rows")
        ref.assert_untouched(snaps_1[slot, kept * layer.plane:], f"{what}: snapshot planes past its rows")
        want_ring = layer.hist[slot, :layer.hist_slots * layer.c].reshape(layer.hist_slots, layer.c).copy()
        for t in range(rows):
            want_ring[(position + t) % layer.hist_slots] = x[t]
        np.testing.assert_array_equal(hist_1[slot, :layer.hist_slots * layer.c].reshape(layer.hist_slots, layer.c)
                                      .view(np.uint32), want_ring.view(np.uint32), err_msg=f"{what}: ring")
        first += rows
