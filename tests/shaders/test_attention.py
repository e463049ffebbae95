"""shaders/attention.metal: q/k norm + RoPE + KV append, flash-decode, flash prefill.

Every kernel is compared with float64 numpy written from docs/design.md, "Full attention" (see
attention_reference.py). Attention tests build the cache in numpy (random int8 codes
with f16 scales, or f16 values) and compare against a reference that reads the very
same dequantized values, so the tolerance measures the kernel, not the quantisation;
cache positions the kernel must not read are NaN (fresh-buffer poison), outputs start
as NaN with NaN padding columns that must stay NaN. The q8 append is checked
exactly against the format (codes and f16 scales of the kernel's own normed k) and
within d / 2 of the float64 reference. Decode gets the step's raw q/k/v (it norms,
rotates and appends them itself): its appended V rows are checked exactly, its K rows
within half a step of the float64 reference, every other cache byte unchanged, and the
attention against float64-normed queries over the cache as the kernel left it. Shapes: 27B heads (24 q / 4 kv) and 0.8B heads
(8 / 2), context lengths straddling 32, rows 1..8, positions up to 100000 with theta
1e7 and 1e6. Tolerances: TOL_QK, TOL_ATTN in attention_reference.py.
"""

import math

import numpy as np
import pytest

from ..support import reference as ref
from .attention_reference import (
    COMBINE_THREADS, DECODE_THREADS, HD, PREFILL_MAX_SIMDGROUPS, PREP_SIMDGROUPS, Q8_BLOCK, Q8_POISON, ROT,
    TOL_ATTN, TOL_QK, attention, attention_inputs, attn_params, cdiv, decode_params, dequant_q8, f16_cache_bytes,
    make_f16_cache, make_q8_cache, mrope, pack_q, prep_params, q8_cache_bytes, quantize_q8_reference, rms_heads, rope,
    rope_turns, seeded, split_q8)
from .params import step_segments

BF16 = np.uint16  # bf16 tensors travel as their bit patterns
EPS = 1e-6


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("attention.metal")


def cache_bytes(kind, max_ctx, kv_dim):
    return q8_cache_bytes(max_ctx, kv_dim) if kind == "q8" else f16_cache_bytes(max_ctx, kv_dim)


def read_cache(buf, kind, max_ctx, kv_dim):
    """Cache buffer -> (raw bytes, values as float64 [max_ctx, kv_dim] (NaN where poisoned))."""
    return read_cache_bytes(buf.numpy(np.uint8, (cache_bytes(kind, max_ctx, kv_dim),)), kind, max_ctx, kv_dim)


def read_cache_bytes(raw, kind, max_ctx, kv_dim):
    """Raw cache bytes -> (raw bytes, values as float64 [max_ctx, kv_dim] (NaN where poisoned))."""
    if kind == "q8":
        codes, scales = split_q8(raw, max_ctx, kv_dim)
        return raw, dequant_q8(codes, scales)
    return raw, raw.view(np.float16).reshape(max_ctx, kv_dim).astype(np.float64)


# ---------------------------------------------------------------------------
# Reference self-checks


@pytest.mark.parametrize("theta", [1e7, 1e6, 1e4])
def test_rope_turns_reproduce_the_angles(theta):
    """The phase table the engine uploads: pos * turns / 2^64 turns == pos * inv_freq rad (mod 2 pi)."""
    turns = rope_turns(theta)
    inv_freq = theta ** (-2.0 * np.arange(ROT // 2) / ROT)
    for pos in (1, 7, 4096, 100000, 262143):
        phase = np.array([(pos * int(t)) % 2**64 for t in turns], dtype=np.float64) / 2.0**64 * 2 * math.pi
        want = np.mod(pos * inv_freq, 2 * math.pi)
        diff = np.abs(np.angle(np.exp(1j * (phase - want))))
        assert diff.max() < 1e-9, (pos, diff.max())


def test_attention_reference_matches_a_direct_softmax():
    """attention() for one row and head == the textbook formula, causal mask included."""
    rng = seeded("ref-attn")
    q, gate = attention_inputs(rng, 2, 2)
    k = rng.standard_normal((5, 1, HD))
    v = rng.standard_normal((5, 1, HD))
    got = attention(q, gate, k, v, 3, 2, 1)
    s = k[:5, 0] @ q[1, 1].astype(np.float64) / 16.0
    want = (np.exp(s) / np.exp(s).sum()) @ v[:5, 0] / (1 + np.exp(-gate[1, 1].astype(np.float64)))
    np.testing.assert_allclose(got[1, 1], want, rtol=1e-12)
    s = k[:4, 0] @ q[0, 0].astype(np.float64) / 16.0  # row 0 sits at position 3: 4 keys
    want = (np.exp(s) / np.exp(s).sum()) @ v[:4, 0] / (1 + np.exp(-gate[0, 0].astype(np.float64)))
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-12)


def test_q8_reference_format():
    x = np.array([np.linspace(-3.0, 1.0, 32), np.zeros(32)], dtype=np.float32).reshape(1, 64)
    codes, d = quantize_q8_reference(x)
    assert d[0, 0] == np.float16(np.float32(3.0) / np.float32(127.0)) and d[0, 1] == 0
    assert codes[0, 0] == -127 and np.all(codes[0, 32:] == 0)
    assert np.all(np.abs(codes.astype(np.float64) * float(d[0, 0]) - x)[0, :32] <= float(d[0, 0]) / 2 + 1e-7)


# ---------------------------------------------------------------------------
# q/k RMSNorm + RoPE + KV append


def run_prep(dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, max_ctx, nq, nkv, pads=(8, 4, 12),
             simdgroups=PREP_SIMDGROUPS, wf32=False, rope_pos=None, **rope_fields):
    """Runs attn_qk_norm_rope_append_<kind> (the *_wf32 variant with the bf16-rounded norms
    as f32 when ``wf32``; rows at rotary positions ``rope_pos`` int [rows, 3] when given, and the
    params' rotary fields from ``rope_fields``); returns (q out [rows][q_stride], k out, k cache,
    v cache, strides)."""
    rows = q.shape[0]
    kv_dim = nkv * HD
    q_stride, k_stride, v_stride = nq * 2 * HD + pads[0], kv_dim + pads[1], kv_dim + pads[2]
    qb = np.full((rows, q_stride), np.nan, np.float32)
    qb[:, :nq * 2 * HD] = q.reshape(rows, -1)
    kb = np.full((rows, k_stride), np.nan, np.float32)
    kb[:, :kv_dim] = k.reshape(rows, -1)
    vb = np.full((rows, v_stride), np.nan, np.float32)
    vb[:, :kv_dim] = v.reshape(rows, -1)
    qbuf, kbuf, vbuf = dev.buffer(qb), dev.buffer(kb), dev.buffer(vb)
    kc = dev.empty(cache_bytes(kind, max_ctx, kv_dim))
    vc = dev.empty(cache_bytes(kind, max_ctx, kv_dim))
    params = prep_params(rows=rows, nq=nq, nkv=nkv, q_stride=q_stride, k_stride=k_stride, v_stride=v_stride,
                         pos_base=pos_base, max_ctx=max_ctx, eps=EPS, has_rope_pos=int(rope_pos is not None),
                         **rope_fields)
    positions = np.zeros((1, 3), np.int32) if rope_pos is None else np.asarray(rope_pos, np.int32)
    def norm(w):
        return dev.buffer(ref.round_bf16(w) if wf32 else ref.bf16_bits(w))
    lib.kernel(f"attn_qk_norm_rope_append_{kind}" + ("_wf32" if wf32 else "")).dispatch(
        {0: qbuf, 1: kbuf, 2: vbuf, 3: norm(q_norm), 4: norm(k_norm),
         5: dev.buffer(rope_turns(theta)), 6: kc, 7: vc, 8: params, 9: dev.buffer(positions)},
        threadgroups=(cdiv(rows * (nq + 2 * nkv), simdgroups),), threads=(simdgroups * 32,))
    return (qbuf.numpy(np.float32, (rows, q_stride)), kbuf.numpy(np.float32, (rows, k_stride)), kc, vc,
            (q_stride, k_stride, v_stride))


PREP_CASES = [
    # kind, nq, nkv, rows, pos_base, theta
    ("q8", 24, 4, 1, 0, 1e7),  # 27B decode step at position 0 (RoPE is the identity)
    ("f16", 24, 4, 3, 17, 1e7),  # 27B verify rows
    ("q8", 8, 2, 7, 5, 1e6),  # 0.8B
    ("f16", 8, 2, 33, 31, 1e6),
    ("q8", 2, 1, 3, 100000, 1e7),  # large positions: float32 angles would be off by ~1e-2 rad
    pytest.param("f16", 2, 1, 2, 100000, 1e6, marks=pytest.mark.slow),
    # rows * (nq + 2 nkv) not a multiple of the SIMD-groups per threadgroup: the last group is partial
    ("q8", 3, 1, 3, 9, 1e6),
    ("f16", 5, 1, 1, 2, 1e7),
]


@pytest.mark.parametrize("kind,nq,nkv,rows,pos_base,theta", PREP_CASES)
def test_qk_norm_rope_append(dev, lib, kind, nq, nkv, rows, pos_base, theta):
    rng = seeded("prep", kind, nq, nkv, rows, pos_base)
    kv_dim = nkv * HD
    q = (rng.standard_normal((rows, nq, 2 * HD)) * 3.0).astype(np.float32)
    k = (rng.standard_normal((rows, nkv, HD)) * 2.0).astype(np.float32)
    v = (rng.standard_normal((rows, nkv, HD)) * 10.0 ** rng.uniform(-1, 1, (rows, nkv, HD // 32)).repeat(32, -1))
    v = v.astype(np.float32)
    k[0, 0, 64:96] = 0.0  # a block past the rotary dims that stays zero: q8 scale 0, codes 0
    v[-1, -1, :32] = 0.0
    v[-1, -1, 7] = -2.5  # a block with one non-zero element
    q_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    k_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    max_ctx = pos_base + rows + 2
    q_out, k_out, kc, vc, (q_stride, k_stride, _) = run_prep(
        dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, max_ctx, nq, nkv)

    positions = pos_base + np.arange(rows)
    want_q = rope(rms_heads(q[..., :HD], q_norm, EPS), positions, theta)
    want_k = rope(rms_heads(k, k_norm, EPS), positions, theta)
    got_q = q_out[:, :nq * 2 * HD].reshape(rows, nq, 2 * HD)
    ref.assert_close(got_q[..., :HD], want_q, TOL_QK, "q normed + rotated")
    assert np.array_equal(got_q[..., HD:], q[..., HD:]), "the gate halves of q changed"
    ref.assert_untouched(q_out[:, nq * 2 * HD:], "q row padding")
    got_k = k_out[:, :kv_dim].reshape(rows, nkv, HD)
    ref.assert_close(got_k, want_k, TOL_QK, "k normed + rotated")
    ref.assert_untouched(k_out[:, kv_dim:], "k row padding")

    written = slice(pos_base, pos_base + rows)
    for side, buf, exact_src, want in (("K", kc, got_k, want_k), ("V", vc, v, v)):
        raw, vals = read_cache(buf, kind, max_ctx, kv_dim)
        exact_src = exact_src.reshape(rows, kv_dim)
        if kind == "q8":
            codes, scales = split_q8(raw, max_ctx, kv_dim)
            want_codes, want_scales = quantize_q8_reference(exact_src)
            assert np.array_equal(scales[written].view(np.uint16), want_scales.view(np.uint16)), \
                f"{side}: scales are not f16(amax / 127)"
            mismatch = codes[written] != want_codes
            assert not mismatch.any(), f"{side}: {int(mismatch.sum())} codes differ from rint(x / d)"
            # Against the float64 math: within half a step (+ the kernel's own f32 error for K).
            step = np.repeat(scales[written].astype(np.float64), Q8_BLOCK, -1)
            ref.assert_within(vals[written], want.reshape(rows, kv_dim),
                              step / 2 + 2 * TOL_QK * np.abs(want).max(), f"{side} dequantized")
            assert np.all(raw[:max_ctx * kv_dim].reshape(max_ctx, kv_dim)[pos_base + rows:] == Q8_POISON)
        else:
            assert np.array_equal(vals[written], exact_src.astype(np.float16).astype(np.float64)), \
                f"{side}: f16 cache is not the f16 rounding of the values"
        untouched = np.ones(max_ctx, bool)
        untouched[written] = False
        ref.assert_untouched(vals[untouched], f"{side} cache rows outside [pos_base, pos_base + rows)")


@pytest.mark.parametrize("simdgroups", [1, 5])
def test_qk_norm_rope_append_any_simdgroup_count(dev, lib, simdgroups):
    """One SIMD-group per (row, head slot) whatever a threadgroup holds: the same bits as the
    default size. 7 rows x 12 slots = 84 SIMD-groups: with 5 per threadgroup the last has 4."""
    kind, nq, nkv, rows, pos_base, theta = "q8", 8, 2, 7, 5, 1e6
    rng = seeded("prep-simdgroups", simdgroups)
    q = (rng.standard_normal((rows, nq, 2 * HD)) * 3.0).astype(np.float32)
    k = (rng.standard_normal((rows, nkv, HD)) * 2.0).astype(np.float32)
    v = rng.standard_normal((rows, nkv, HD)).astype(np.float32)
    q_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    k_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    args = (dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, pos_base + rows, nq, nkv)
    want = run_prep(*args)
    got = run_prep(*args, simdgroups=simdgroups)
    for what, a, b in (("q", got[0], want[0]), ("k", got[1], want[1])):
        np.testing.assert_array_equal(a, b, err_msg=f"{simdgroups} SIMD-groups: {what}")
    for what, a, b in (("K cache", got[2], want[2]), ("V cache", got[3], want[3])):
        np.testing.assert_array_equal(a.numpy(np.uint8), b.numpy(np.uint8), err_msg=f"{simdgroups} SIMD-groups: {what}")


MROPE_SECTIONS = (11, 11, 10)  # Qwen3.5's: 32 rotary pairs, pairs 1, 4, .. height and 2, 5, .. 29 width


@pytest.mark.parametrize("kind", ["q8", "f16"])
def test_qk_norm_rope_append_mrope_positions(dev, lib, kind):
    """Rows of a prefill chunk with an image: each row rotates at its own (time, height, width)
    with the interleaved M-RoPE pair selection, K appended at its cache row as always."""
    nq, nkv, pos_base, theta = 4, 2, 3, 1e7
    rng = seeded("prep-mrope", kind)
    # 2 text rows, a 2 x 3 image's 6 rows at (5, 5 + row, 5 + col), 2 text rows from 8.
    grid = [(5, 5 + r, 5 + c) for r in range(2) for c in range(3)]
    positions = np.array([(3, 3, 3), (4, 4, 4), *grid, (8, 8, 8), (9, 9, 9)], np.int32)
    rows = len(positions)
    q = (rng.standard_normal((rows, nq, 2 * HD)) * 3.0).astype(np.float32)
    k = (rng.standard_normal((rows, nkv, HD)) * 2.0).astype(np.float32)
    v = rng.standard_normal((rows, nkv, HD)).astype(np.float32)
    q_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    k_norm = ref.round_bf16(rng.uniform(0.3, 2.0, HD))
    ends = dict(mrope_h_end=3 * MROPE_SECTIONS[1], mrope_w_end=3 * MROPE_SECTIONS[2])
    max_ctx = pos_base + rows + 1
    q_out, k_out, kc, vc, _ = run_prep(dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, max_ctx, nq, nkv,
                                       rope_pos=positions, **ends)
    want_q = mrope(rms_heads(q[..., :HD], q_norm, EPS), positions, theta, MROPE_SECTIONS)
    want_k = mrope(rms_heads(k, k_norm, EPS), positions, theta, MROPE_SECTIONS)
    ref.assert_close(q_out[:, :nq * 2 * HD].reshape(rows, nq, 2 * HD)[..., :HD], want_q, TOL_QK, "q (M-RoPE)")
    ref.assert_close(k_out[:, :nkv * HD].reshape(rows, nkv, HD), want_k, TOL_QK, "k (M-RoPE)")
    # The pair selection matters: plain RoPE at the time component is far off on the image rows.
    assert np.abs(rope(rms_heads(k, k_norm, EPS), positions[:, 0], theta) - want_k)[2:8].max() > 1e-2
    # Text rows given as rope_pos (all components equal) are the bits of rows at cache row +
    # rope_delta: the text rows of an image prompt match the text path's.
    delta = 5
    text = np.repeat((pos_base + delta + np.arange(rows))[:, None], 3, 1)
    a = run_prep(dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, max_ctx, nq, nkv, rope_pos=text, **ends)
    b = run_prep(dev, lib, kind, q, k, v, q_norm, k_norm, theta, pos_base, max_ctx, nq, nkv, rope_delta=delta, **ends)
    for what, x, y in (("q", a[0], b[0]), ("k", a[1], b[1])):
        np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32), err_msg=what)
    for what, x, y in (("K cache", a[2], b[2]), ("V cache", a[3], b[3])):
        np.testing.assert_array_equal(x.numpy(np.uint8), y.numpy(np.uint8), err_msg=what)
    want_k = rope(rms_heads(k, k_norm, EPS), pos_base + delta + np.arange(rows), theta)
    ref.assert_close(b[1][:, :nkv * HD].reshape(rows, nkv, HD), want_k, TOL_QK, "k at cache row + rope_delta")


# ---------------------------------------------------------------------------
# Decode (flash-decode partials + combine)


@pytest.mark.parametrize("kind", ["q8", "f16"])
def test_qk_norm_rope_append_wf32_reads_f32_norms(dev, lib, kind):
    """The *_wf32 variant (f32 q/k norm weights, as f32 or f16 checkpoints give them) reproduces
    the bf16 variant bit for bit on the same values: outputs and both caches."""
    rng = seeded("prep-wf32", kind)
    nq, nkv, rows = 4, 2, 3
    q = rng.standard_normal((rows, nq, 2 * HD)).astype(np.float32)
    k = rng.standard_normal((rows, nkv, HD)).astype(np.float32)
    v = rng.standard_normal((rows, nkv, HD)).astype(np.float32)
    q_norm, k_norm = rng.normal(1.0, 0.3, HD), rng.normal(1.0, 0.3, HD)
    args = (dev, lib, kind, q, k, v, q_norm, k_norm, 1e7, 5, 16, nq, nkv)
    got, want = run_prep(*args, wf32=True), run_prep(*args)
    for g, w in [(got[0], want[0]), (got[1], want[1])]:
        assert np.array_equal(g.view(np.uint32), w.view(np.uint32))
    for g, w in [(got[2], want[2]), (got[3], want[3])]:
        assert np.array_equal(g.numpy(np.uint8), w.numpy(np.uint8))


def decode_inputs(rng, rows, nq, nkv, q_scale=1.0):
    """A step's raw projections and norm weights: q, gate [rows, nq, HD], k, v [rows, nkv, HD],
    q_norm, k_norm [HD] (bf16 values)."""
    q, gate = attention_inputs(rng, rows, nq, scale=q_scale)
    k = (rng.standard_normal((rows, nkv, HD)) * 2.0).astype(np.float32)
    v = rng.standard_normal((rows, nkv, HD)).astype(np.float32)
    q_norm = ref.round_bf16(rng.uniform(0.5, 1.5, HD))
    k_norm = ref.round_bf16(rng.uniform(0.5, 1.5, HD))
    return q, gate, k, v, q_norm, k_norm


def run_decode(dev, lib, kind, r, kraw, vraw, step, theta, pos_base, max_ctx, nq, nkv, split_len, out_pad=4,
               heads=None, combine_threads=COMBINE_THREADS, wf32=False, rope_delta=0):
    """attn_decode_<kind>_r<r> (+ attn_decode_combine when split) for the step's raw inputs
    `step` (decode_inputs) over caches holding positions < pos_base: returns (out [rows, nq, HD],
    out padding columns, part_o, part_ms, K cache bytes, V cache bytes after the step). A
    threadgroup holds `heads` SIMD-groups (default all nq / nkv query heads of a kv head;
    fewer split them into head blocks). k and v rows carry NaN padding columns."""
    q, gate, k, v, q_norm, k_norm = step
    rows = q.shape[0]
    heads = heads or nq // nkv
    kv_dim = nkv * HD
    q_stride, k_stride, v_stride = nq * 2 * HD + 4, kv_dim + 4, kv_dim + 8
    out_stride = nq * HD + out_pad
    ctx = pos_base + rows
    n_splits = cdiv(ctx, split_len)
    params = decode_params(nq=nq, nkv=nkv, q_stride=q_stride, k_stride=k_stride, v_stride=v_stride,
                           out_stride=out_stride, max_ctx=max_ctx, cache_slot_bytes=cache_bytes(kind, max_ctx, kv_dim),
                           n_splits=n_splits, split_len=[split_len], eps=EPS, rope_delta=[rope_delta])
    segs = step_segments((0, rows, pos_base))
    kb = np.full((rows, k_stride), np.nan, np.float32)
    kb[:, :kv_dim] = k.reshape(rows, kv_dim)
    vb = np.full((rows, v_stride), np.nan, np.float32)
    vb[:, :kv_dim] = v.reshape(rows, kv_dim)
    def norm(w):
        return dev.buffer(ref.round_bf16(w) if wf32 else ref.bf16_bits(w))
    qbuf = dev.buffer(pack_q(q, gate, q_stride))
    kc, vc = dev.buffer(kraw), dev.buffer(vraw)
    out = dev.buffer(np.full((rows, out_stride), np.nan, np.float32))
    part_o = dev.empty(rows * nq * n_splits * HD * 4)
    part_ms = dev.empty(rows * nq * n_splits * 8)
    cb = dev.command_buffer()
    cb.dispatch(lib.kernel(f"attn_decode_{kind}_r{r}" + ("_wf32" if wf32 else "")),
                {0: qbuf, 1: dev.buffer(kb), 2: dev.buffer(vb), 3: norm(q_norm), 4: norm(k_norm),
                 5: dev.buffer(rope_turns(theta)), 6: kc, 7: vc, 8: part_o, 9: part_ms, 10: out, 11: segs, 12: params},
                threadgroups=(n_splits, nkv * cdiv(nq // nkv, heads), cdiv(rows, r)), threads=(heads * 32,))
    if n_splits > 1:
        cb.barrier()
        cb.dispatch(lib.kernel("attn_decode_combine"), {0: qbuf, 1: part_o, 2: part_ms, 3: out, 4: segs, 5: params},
                    threadgroups=(nq, rows), threads=(combine_threads,))
    cb.commit()
    cb.wait()
    got = out.numpy(np.float32, (rows, out_stride))
    nbytes = cache_bytes(kind, max_ctx, kv_dim)
    return (got[:, :nq * HD].reshape(rows, nq, HD), got[:, nq * HD:],
            part_o.numpy(np.float32, (rows, nq, n_splits, HD)), part_ms.numpy(np.float32, (rows, nq, n_splits, 2)),
            kc.numpy(np.uint8, (nbytes,)), vc.numpy(np.uint8, (nbytes,)))


def make_cache(rng, kind, ctx, max_ctx, kv_dim):
    return make_q8_cache(rng, ctx, max_ctx, kv_dim) if kind == "q8" else make_f16_cache(rng, ctx, max_ctx, kv_dim)


def row_bytes(kind, max_ctx, kv_dim, first, end):
    """Mask of the cache bytes that hold positions [first, end) (codes and scales for q8)."""
    mask = np.zeros(cache_bytes(kind, max_ctx, kv_dim), bool)
    if kind == "q8":
        mask[first * kv_dim:end * kv_dim] = True
        plane, width = max_ctx * kv_dim, kv_dim // Q8_BLOCK * 2
        mask[plane + first * width:plane + end * width] = True
    else:
        mask[first * kv_dim * 2:end * kv_dim * 2] = True
    return mask


def check_appended(kind, kc_before, vc_before, kc_after, vc_after, step, theta, pos_base, max_ctx, nkv, rope_delta=0):
    """The step's K/V rows in the caches: V exactly the format's rounding of v; K (rotated at
    cache row + rope_delta) within half a q8 step (f16: half an ulp) plus the f32 error of norm
    and RoPE of the float64 reference; every other byte unchanged."""
    _, _, k, v, _, k_norm = step
    rows, kv_dim = k.shape[0], nkv * HD
    written = slice(pos_base, pos_base + rows)
    want_k = rope(rms_heads(k, k_norm, EPS), pos_base + rope_delta + np.arange(rows), theta).reshape(rows, kv_dim)
    _, kvals = read_cache_bytes(kc_after, kind, max_ctx, kv_dim)
    _, vvals = read_cache_bytes(vc_after, kind, max_ctx, kv_dim)
    v = v.reshape(rows, kv_dim)
    if kind == "q8":
        codes, scales = split_q8(vc_after, max_ctx, kv_dim)
        want_codes, want_scales = quantize_q8_reference(v)
        assert np.array_equal(scales[written].view(np.uint16), want_scales.view(np.uint16)), "V scales"
        assert np.array_equal(codes[written], want_codes), "V codes"
        _, kscales = split_q8(kc_after, max_ctx, kv_dim)
        half_step = np.repeat(kscales[written].astype(np.float64), Q8_BLOCK, -1) / 2
    else:
        assert np.array_equal(vvals[written], v.astype(np.float16).astype(np.float64)), "V f16 rounding"
        half_step = np.abs(want_k) * 2.0**-11
    ref.assert_within(kvals[written], want_k, half_step + 2 * TOL_QK * np.abs(want_k).max(), "K appended")
    others = ~row_bytes(kind, max_ctx, kv_dim, pos_base, pos_base + rows)
    assert np.array_equal(kc_after[others], kc_before[others]), "K cache bytes outside the step's rows changed"
    assert np.array_equal(vc_after[others], vc_before[others]), "V cache bytes outside the step's rows changed"


def decode_reference(kind, kc_after, vc_after, step, theta, pos_base, max_ctx, nq, nkv, rope_delta=0):
    """float64 attention of the normed, rotated queries (at cache row + rope_delta) over the
    cache as the step left it (the kernel's own appended rows, checked by check_appended)."""
    q, gate, _, _, q_norm, _ = step
    rows, kv_dim = q.shape[0], nkv * HD
    ctx = pos_base + rows
    _, kd = read_cache_bytes(kc_after, kind, max_ctx, kv_dim)
    _, vd = read_cache_bytes(vc_after, kind, max_ctx, kv_dim)
    want_q = rope(rms_heads(q, q_norm, EPS), pos_base + rope_delta + np.arange(rows), theta)
    return want_q, attention(want_q, gate, kd[:ctx].reshape(ctx, nkv, HD), vd[:ctx].reshape(ctx, nkv, HD), pos_base,
                             nq, nkv)


DECODE_CASES = [
    # kind, nq, nkv, ctx (= pos_base + rows), rows, R, split_len
    ("q8", 24, 4, 1, 1, 1, 64),  # the first token: one position, one split
    ("f16", 24, 4, 1, 1, 4, 64),
    ("q8", 8, 2, 31, 1, 1, 32),
    ("f16", 8, 2, 32, 2, 4, 8),  # 4 splits
    ("q8", 8, 2, 33, 3, 1, 32),  # the last split holds position 32 only
    ("f16", 8, 2, 33, 8, 4, 16),  # split [32, 33) is empty for rows 0..6; the step's rows straddle two splits
    ("q8", 8, 2, 7, 7, 4, 64),  # rows from position 0: causal within the rows, nothing cached
    ("q8", 8, 2, 23, 5, 4, 5),  # splits not a multiple of the keys in flight; rows 18..22 in one split
    ("f16", 8, 2, 10, 8, 4, 3),  # more rows than a split: every split appends some
    ("q8", 24, 4, 512, 4, 4, 128),  # 27B
    ("f16", 24, 4, 512, 1, 1, 512),
    ("q8", 8, 2, 1037, 8, 4, 100),
    ("f16", 8, 2, 1037, 5, 1, 256),
    ("f16", 8, 2, 300, 6, 4, 1000),  # row groups of 4 + 2, one split: output written directly
    ("q8", 24, 4, 1100, 2, 1, 64),  # 27B, long context, 18 splits
    ("f16", 24, 4, 2048, 8, 4, 256),  # 27B, 8 verify rows
    ("q8", 8, 2, 140, 17, 4, 64),  # a deep verify step (16 drafts + 1): row groups 4 x 4 + 1, across a split edge
]


def check_decode(dev, lib, kind, nq, nkv, ctx, rows, r, split_len, theta=1e7, rope_delta=0, **threads):
    rng = seeded("decode", kind, nq, nkv, ctx, rows, r)
    kv_dim = nkv * HD
    pos_base = ctx - rows
    max_ctx = ctx + 3  # poisoned positions past the context must never be read
    kraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)  # the step's own rows are poisoned too
    vraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)
    step = decode_inputs(rng, rows, nq, nkv)
    got, pad, _, _, kc, vc = run_decode(dev, lib, kind, r, kraw, vraw, step, theta, pos_base, max_ctx, nq, nkv,
                                        split_len, rope_delta=rope_delta, **threads)
    check_appended(kind, kraw, vraw, kc, vc, step, theta, pos_base, max_ctx, nkv, rope_delta)
    _, want = decode_reference(kind, kc, vc, step, theta, pos_base, max_ctx, nq, nkv, rope_delta)
    ref.assert_close(got, want, TOL_ATTN, f"decode {kind} ctx {ctx} rows {rows} {threads}")
    ref.assert_untouched(pad, "out row padding")


@pytest.mark.parametrize("kind,nq,nkv,ctx,rows,r,split_len", DECODE_CASES)
def test_decode(dev, lib, kind, nq, nkv, ctx, rows, r, split_len):
    check_decode(dev, lib, kind, nq, nkv, ctx, rows, r, split_len)


DECODE_SMALL_THREADGROUP_CASES = [
    # kind, nq, nkv, ctx, rows, R, split_len, heads per threadgroup, combine threads
    ("q8", 24, 4, 33, 1, 1, 16, 4, 32),  # 27B: 6 heads of a kv head in blocks of 4 + 2
    ("f16", 24, 4, 100, 5, 4, 1000, 1, 64),  # one head per threadgroup, one split (no combine)
    ("q8", 32, 2, 50, 3, 4, 16, 5, 96),  # 16 heads per kv head in blocks 5, 5, 5, 1; idle combine threads
    ("f16", 32, 2, 70, 8, 4, 32, 16, 32),  # all 16 heads: the most SIMD-groups the kernel declares
]


@pytest.mark.parametrize("kind,nq,nkv,ctx,rows,r,split_len,heads,combine", DECODE_SMALL_THREADGROUP_CASES)
def test_decode_with_fewer_threads_than_heads(dev, lib, kind, nq, nkv, ctx, rows, r, split_len, heads, combine):
    """A pipeline limit below (nq / nkv) * 32 threads: query heads split into head blocks."""
    check_decode(dev, lib, kind, nq, nkv, ctx, rows, r, split_len, heads=heads, combine_threads=combine)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["q8", "f16"])
def test_decode_large_positions(dev, lib, kind):
    """RoPE of the step's q and k at position ~1e5 (float32 angles would be off by ~1e-2 rad)."""
    check_decode(dev, lib, kind, 2, 1, 100003, 3, 4, 40000, theta=1e6)


@pytest.mark.parametrize("kind,rope_delta", [("q8", -45), ("f16", 7)])
def test_decode_rotates_at_cache_row_plus_rope_delta(dev, lib, kind, rope_delta):
    """Text rows after an image: q and the appended k rotate at cache row + the sequence's
    rope_delta (negative after images), attention still over cache rows 0 .. row."""
    check_decode(dev, lib, kind, 8, 2, 60, 3, 4, 16, rope_delta=rope_delta)


@pytest.mark.parametrize("kind", ["q8", "f16"])
def test_decode_appends_what_prep_appends(dev, lib, kind):
    """A decode step's K/V rows are the bytes attn_qk_norm_rope_append (prefill) writes for
    the same inputs, so a cache reads the same whichever step kind filled it."""
    nq, nkv, rows, pos_base, theta = 8, 2, 6, 37, 1e7
    rng = seeded("decode-vs-prep", kind)
    kv_dim, max_ctx = nkv * HD, pos_base + rows + 1
    kraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)
    vraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)
    step = decode_inputs(rng, rows, nq, nkv)
    q, gate, k, v, q_norm, k_norm = step
    *_, kc, vc = run_decode(dev, lib, kind, 4, kraw, vraw, step, theta, pos_base, max_ctx, nq, nkv, 16)
    *_, pkc, pvc, _ = run_prep(dev, lib, kind, np.concatenate([q, gate], -1), k, v, q_norm, k_norm, theta, pos_base,
                               max_ctx, nq, nkv)
    written = row_bytes(kind, max_ctx, kv_dim, pos_base, pos_base + rows)
    nbytes = cache_bytes(kind, max_ctx, kv_dim)
    assert np.array_equal(kc[written], pkc.numpy(np.uint8, (nbytes,))[written]), "K rows differ"
    assert np.array_equal(vc[written], pvc.numpy(np.uint8, (nbytes,))[written]), "V rows differ"


def test_decode_variants_agree_bit_for_bit(dev, lib):
    """A row's output does not depend on its kernel variant: r1 and r4 for one row, and the
    *_wf32 variant (f32 norm weights) with the bf16 variant's values."""
    kind, nq, nkv, pos_base, split_len, theta = "q8", 8, 2, 150, 64, 1e7
    rng = seeded("decode-variants")
    kv_dim, max_ctx = nkv * HD, pos_base + 1
    kraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)
    vraw, _ = make_cache(rng, kind, pos_base, max_ctx, kv_dim)
    step = decode_inputs(rng, 1, nq, nkv)
    args = (dev, lib, kind)
    rest = (kraw, vraw, step, theta, pos_base, max_ctx, nq, nkv, split_len)
    want = run_decode(*args, 1, *rest)
    for what, got in (("r4", run_decode(*args, 4, *rest)), ("r1 wf32", run_decode(*args, 1, *rest, wf32=True))):
        for name, a, b in zip(("out", "pad", "part_o", "part_ms", "K cache", "V cache"), got, want):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: {name}"


def test_decode_partials_are_log2_scaled(dev, lib):
    """part_ms holds (max of q.k log2(e)/16, sum 2^(s - m)) per split and part_o the matching
    sum of 2^(s - m) v: the format attn_decode_combine (and any other consumer) relies on."""
    kind, nq, nkv, rows, pos_base, split_len, theta = "f16", 8, 2, 3, 40, 16, 1e7
    rng = seeded("partials")
    ctx, kv_dim = pos_base + rows, nkv * HD
    kraw, _ = make_f16_cache(rng, pos_base, ctx, kv_dim)
    vraw, _ = make_f16_cache(rng, pos_base, ctx, kv_dim)
    step = decode_inputs(rng, rows, nq, nkv, q_scale=2.0)
    _, _, part_o, part_ms, kc, vc = run_decode(dev, lib, kind, 4, kraw, vraw, step, theta, pos_base, ctx, nq, nkv,
                                               split_len)
    q, _ = decode_reference(kind, kc, vc, step, theta, pos_base, ctx, nq, nkv)
    _, kd = read_cache_bytes(kc, kind, ctx, kv_dim)
    _, vd = read_cache_bytes(vc, kind, ctx, kv_dim)
    k, v = kd.reshape(ctx, nkv, HD), vd.reshape(ctx, nkv, HD)
    for row in range(rows):
        for h in range(nq):
            s = k[:, h // (nq // nkv)] @ q[row, h] * math.log2(math.e) / math.sqrt(HD)
            for split in range(cdiv(ctx, split_len)):
                t = np.arange(split * split_len, min((split + 1) * split_len, pos_base + row + 1))
                m_got, l_got = part_ms[row, h, split]
                if t.size == 0:
                    assert l_got == 0 and m_got < -1e38 and np.all(part_o[row, h, split] == 0)
                    continue
                m = s[t].max()
                p = np.exp2(s[t] - m)
                assert abs(m_got - m) <= 1e-5 * max(1.0, abs(m)), (row, h, split, m_got, m)
                assert abs(l_got - p.sum()) <= 1e-5 * p.sum(), (row, h, split, l_got, p.sum())
                ref.assert_close(part_o[row, h, split], p @ v[t, h // (nq // nkv)], 1e-5, "part_o")


# ---------------------------------------------------------------------------
# Several sequences in one decode step (StepSegments): per-slot caches, per-segment splits


def run_decode_segments(dev, lib, kind, r, segments, split_lens, caches, steps, max_ctx, nq, nkv, theta=1e7):
    """attn_decode_<kind>_r<r> (+ combine) for segments [(slot, rows, position)] with per-segment
    split lengths over K and V buffers [slots][slot_bytes] (caches: their initial bytes) and each
    segment's step (decode_inputs), rows stacked in order. Returns (out [rows, nq, HD], K bytes,
    V bytes [slots][slot_bytes])."""
    kv_dim, rows = nkv * HD, sum(seg[1] for seg in segments)
    q_stride, kv_stride, out_stride = nq * 2 * HD + 4, kv_dim + 4, nq * HD + 4
    n_splits = max(cdiv(position + n, length) for (_, n, position), length in zip(segments, split_lens))
    params = decode_params(nq=nq, nkv=nkv, q_stride=q_stride, k_stride=kv_stride, v_stride=kv_stride,
                           out_stride=out_stride, max_ctx=max_ctx, cache_slot_bytes=caches[0].shape[1],
                           n_splits=n_splits, split_len=split_lens, eps=EPS)
    segs = step_segments(*segments)

    def stacked(i, width, stride):
        rows_of = np.concatenate([step[i].reshape(step[i].shape[0], width) for step in steps])
        return np.concatenate([rows_of, np.full((rows, stride - width), np.nan, np.float32)], 1)
    qbuf = dev.buffer(np.concatenate([pack_q(step[0], step[1], q_stride) for step in steps]))
    kc, vc = dev.buffer(caches[0].copy()), dev.buffer(caches[1].copy())
    out = dev.buffer(np.full((rows, out_stride), np.nan, np.float32))
    part_o = dev.empty(rows * nq * n_splits * HD * 4)
    part_ms = dev.empty(rows * nq * n_splits * 8)
    q_norm, k_norm = steps[0][4], steps[0][5]  # one layer: one pair of norm weights
    cb = dev.command_buffer()
    cb.dispatch(lib.kernel(f"attn_decode_{kind}_r{r}"),
                {0: qbuf, 1: dev.buffer(stacked(2, kv_dim, kv_stride)), 2: dev.buffer(stacked(3, kv_dim, kv_stride)),
                 3: dev.buffer(ref.bf16_bits(q_norm)), 4: dev.buffer(ref.bf16_bits(k_norm)),
                 5: dev.buffer(rope_turns(theta)), 6: kc, 7: vc, 8: part_o, 9: part_ms, 10: out, 11: segs, 12: params},
                threadgroups=(n_splits, nkv, sum(cdiv(n, r) for _, n, _ in segments)), threads=(nq // nkv * 32,))
    if n_splits > 1:
        cb.barrier()
        cb.dispatch(lib.kernel("attn_decode_combine"), {0: qbuf, 1: part_o, 2: part_ms, 3: out, 4: segs, 5: params},
                    threadgroups=(nq, rows), threads=(COMBINE_THREADS,))
    cb.commit()
    cb.wait()
    got = out.numpy(np.float32, (rows, out_stride))
    ref.assert_untouched(got[:, nq * HD:], "out row padding")
    return (got[:, :nq * HD].reshape(rows, nq, HD), kc.numpy(np.uint8, caches[0].shape),
            vc.numpy(np.uint8, caches[1].shape))


# kernel, [(slot, rows, position)], per-segment split lengths: slots out of order and not
# adjacent, a first token (position 0), contexts past 128 with several splits next to one
# with a single split (written directly, skipped by the combine), 1-row and multi-row
# segments (r4: 5 rows = row groups of 4 + 1, never shared with the next segment).
DECODE_SEGMENT_CASES = [
    ("q8", 4, [(2, 3, 200), (0, 1, 0), (3, 5, 131)], [64, 64, 32]),
    ("f16", 4, [(1, 4, 150), (3, 2, 9)], [40, 128]),
    ("q8", 1, [(3, 1, 300), (0, 1, 0), (2, 1, 140), (1, 1, 7)], [128, 64, 35, 8]),
    ("f16", 1, [(0, 1, 129), (2, 1, 4)], [32, 64]),
    ("f16", 4, [(1, 12, 140), (0, 5, 60)], [64, 32]),  # a deep shared step: 17 rows
]


@pytest.mark.parametrize("kind,r,segments,split_lens", DECODE_SEGMENT_CASES)
def test_decode_segments_equal_each_segment_alone_bitwise(dev, lib, kind, r, segments, split_lens):
    """Each segment's output rows and its slot's K/V caches equal the segment decoded alone, bit
    for bit; no other slot's cache (nor the padding between slots) changes; the segment alone
    matches the float64 reference."""
    nq, nkv, theta = 8, 2, 1e7
    kv_dim = nkv * HD
    rng = seeded("decode-segments", kind, r, tuple(segments))
    max_ctx = max(position + rows for _, rows, position in segments) + 3
    n_slots = max(slot for slot, _, _ in segments) + 2  # the last slot is never used
    one = cache_bytes(kind, max_ctx, kv_dim)
    slot_bytes = one + 16  # padding between slots (random bytes) must stay as it is
    caches = [rng.integers(0, 256, (n_slots, slot_bytes), dtype=np.uint8) for _ in range(2)]
    for slot, _, position in segments:  # the sequence's positions < position; the rest poisoned
        for c in caches:
            c[slot, :one] = make_cache(rng, kind, position, max_ctx, kv_dim)[0]
    steps = [decode_inputs(rng, rows, nq, nkv) for _, rows, _ in segments]
    steps = [step[:4] + steps[0][4:] for step in steps]  # one layer's q/k norm weights
    out, kc, vc = run_decode_segments(dev, lib, kind, r, segments, split_lens, caches, steps, max_ctx, nq, nkv, theta)
    used = {slot for slot, _, _ in segments}
    for name, got, before in (("K", kc, caches[0]), ("V", vc, caches[1])):
        for slot in range(n_slots):
            start = one if slot in used else 0
            assert np.array_equal(got[slot, start:], before[slot, start:]), f"{name} cache of slot {slot} from {start}"
    first = 0
    for segment, length, step in zip(segments, split_lens, steps):
        slot, rows, position = segment
        what = f"{kind} r{r} segment {segment} split_len {length}"
        out_1, kc_1, vc_1 = run_decode_segments(dev, lib, kind, r, [segment], [length], caches, [step], max_ctx, nq,
                                                nkv, theta)
        assert np.array_equal(out[first:first + rows].view(np.uint32), out_1.view(np.uint32)), f"{what}: out"
        assert np.array_equal(kc[slot], kc_1[slot]), f"{what}: K cache"
        assert np.array_equal(vc[slot], vc_1[slot]), f"{what}: V cache"
        for other in range(n_slots):
            if other != slot:
                assert np.array_equal(kc_1[other], caches[0][other]), f"{what} alone: K cache of slot {other}"
                assert np.array_equal(vc_1[other], caches[1][other]), f"{what} alone: V cache of slot {other}"
        check_appended(kind, caches[0][slot, :one], caches[1][slot, :one], kc_1[slot, :one], vc_1[slot, :one], step,
                       theta, position, max_ctx, nkv)
        _, want = decode_reference(kind, kc_1[slot, :one], vc_1[slot, :one], step, theta, position, max_ctx, nq, nkv)
        ref.assert_close(out_1, want, TOL_ATTN, what)
        first += rows


# ---------------------------------------------------------------------------
# Prefill (flash attention on SIMD-group matrices)


def run_prefill(dev, lib, kind, kraw, vraw, q, gate, pos_base, max_ctx, nq, nkv, rb, out_pad=4, simdgroups=None):
    """attn_prefill_<kind> with `simdgroups` per threadgroup (default n_rep * rb): below n_rep
    they take a head block of n_rep each; above, simdgroups // n_rep row blocks, the rest idle."""
    rows = q.shape[0]
    n_rep = nq // nkv
    simdgroups = simdgroups or n_rep * rb
    heads = min(n_rep, simdgroups)
    rb = simdgroups // heads
    assert simdgroups <= PREFILL_MAX_SIMDGROUPS
    q_stride = nq * 2 * HD + 8
    out_stride = nq * HD + out_pad
    params = attn_params(rows=rows, nq=nq, nkv=nkv, q_stride=q_stride, out_stride=out_stride, pos_base=pos_base,
                         max_ctx=max_ctx)
    qbuf = dev.buffer(pack_q(q, gate, q_stride, pad_rows=cdiv(rows, 8) * 8 - rows))  # NaN padding rows
    out = dev.buffer(np.full((rows, out_stride), np.nan, np.float32))
    lib.kernel(f"attn_prefill_{kind}").dispatch(
        {0: qbuf, 1: dev.buffer(kraw), 2: dev.buffer(vraw), 3: out, 4: params},
        threadgroups=(cdiv(rows, 8 * rb), nkv * cdiv(n_rep, heads)), threads=(simdgroups * 32,))
    got = out.numpy(np.float32, (rows, out_stride))
    return got[:, :nq * HD].reshape(rows, nq, HD), got[:, nq * HD:]


PREFILL_CASES = [
    # kind, nq, nkv, rows (chunk), pos_base, row blocks per threadgroup
    ("q8", 8, 2, 1, 0, 1),
    ("f16", 8, 2, 7, 0, 2),
    ("q8", 8, 2, 33, 0, 2),
    ("f16", 8, 2, 64, 0, 1),
    ("q8", 8, 2, 64, 200, 4),  # 16 SIMD-groups, the maximum
    ("f16", 8, 2, 33, 45, 1),
    ("q8", 8, 2, 1, 77, 1),
    ("f16", 24, 4, 7, 130, 1),  # 27B heads
    ("q8", 24, 4, 64, 0, 2),
    ("f16", 24, 4, 64, 300, 1),
    ("q8", 8, 2, 129, 3, 2),  # straddles 128 rows
]


def check_prefill(dev, lib, kind, nq, nkv, rows, pos_base, rb, simdgroups=None):
    rng = seeded("prefill", kind, nq, nkv, rows, pos_base, rb)
    kv_dim = nkv * HD
    ctx = pos_base + rows
    max_ctx = ctx + 5
    kraw, kd = make_cache(rng, kind, ctx, max_ctx, kv_dim)
    vraw, vd = make_cache(rng, kind, ctx, max_ctx, kv_dim)
    q, gate = attention_inputs(rng, rows, nq)
    got, pad = run_prefill(dev, lib, kind, kraw, vraw, q, gate, pos_base, max_ctx, nq, nkv, rb, simdgroups=simdgroups)
    want = attention(q, gate, kd.reshape(ctx, nkv, HD), vd.reshape(ctx, nkv, HD), pos_base, nq, nkv)
    ref.assert_close(got, want, TOL_ATTN, f"prefill {kind} rows {rows} base {pos_base} simdgroups {simdgroups}")
    ref.assert_untouched(pad, "out row padding")


@pytest.mark.parametrize("kind,nq,nkv,rows,pos_base,rb", PREFILL_CASES)
def test_prefill(dev, lib, kind, nq, nkv, rows, pos_base, rb):
    check_prefill(dev, lib, kind, nq, nkv, rows, pos_base, rb)


PREFILL_SMALL_THREADGROUP_CASES = [
    # kind, nq, nkv, rows, pos_base, SIMD-groups per threadgroup
    ("q8", 24, 4, 33, 10, 4),  # 27B: 6 heads of a kv head in blocks of 4 + 2
    ("f16", 24, 4, 9, 0, 1),  # one head, 8 rows per threadgroup
    ("q8", 32, 2, 16, 3, 8),  # 16 heads per kv head in two blocks of 8
    ("f16", 8, 2, 17, 5, 6),  # 4 heads fit once in 6 SIMD-groups: 2 idle (they still stage K/V)
    ("q8", 32, 2, 24, 7, 16),  # all 16 heads: the most SIMD-groups the kernel declares
]


@pytest.mark.parametrize("kind,nq,nkv,rows,pos_base,simdgroups", PREFILL_SMALL_THREADGROUP_CASES)
def test_prefill_with_other_threadgroup_sizes(dev, lib, kind, nq, nkv, rows, pos_base, simdgroups):
    """A pipeline limit below the engine's preferred size: head blocks, or idle SIMD-groups."""
    check_prefill(dev, lib, kind, nq, nkv, rows, pos_base, 1, simdgroups=simdgroups)


def test_attention_kernels_declare_their_threadgroup_sizes(lib):
    for name in ("attn_decode_q8_r1", "attn_decode_q8_r4", "attn_decode_f16_r1", "attn_decode_f16_r4"):
        assert lib.kernel(name).max_threads_per_threadgroup <= DECODE_THREADS, name
    for name in ("attn_prefill_q8", "attn_prefill_f16"):
        assert lib.kernel(name).max_threads_per_threadgroup <= PREFILL_MAX_SIMDGROUPS * 32, name


# ---------------------------------------------------------------------------
# The kernels together, as a layer runs them


@pytest.mark.parametrize("kind", ["q8", "f16"])
def test_prefill_then_decode_through_the_cache(dev, lib, kind):
    """Append a 9-row chunk (prep), prefill it, then decode 2 verify rows at positions 9, 10
    (the decode kernel appends them itself): both attentions see exactly the cache the
    appends wrote."""
    nq, nkv, theta = 8, 2, 1e7
    kv_dim = nkv * HD
    max_ctx = 16
    rng = seeded("chain", kind)
    q_norm = ref.round_bf16(rng.uniform(0.5, 1.5, HD))
    k_norm = ref.round_bf16(rng.uniform(0.5, 1.5, HD))
    kc = dev.empty(cache_bytes(kind, max_ctx, kv_dim))
    vc = dev.empty(cache_bytes(kind, max_ctx, kv_dim))
    q_stride = nq * 2 * HD
    norms = {3: dev.buffer(ref.bf16_bits(q_norm)), 4: dev.buffer(ref.bf16_bits(k_norm)),
             5: dev.buffer(rope_turns(theta))}
    for pos_base, rows, step in ((0, 9, "prefill"), (9, 2, "verify")):
        q = (rng.standard_normal((cdiv(rows, 8) * 8, nq * 2 * HD)) * 3.0).astype(np.float32)
        k = (rng.standard_normal((rows, kv_dim)) * 2.0).astype(np.float32)
        v = rng.standard_normal((rows, kv_dim)).astype(np.float32)
        qbuf, kbuf, vbuf = dev.buffer(q), dev.buffer(k), dev.buffer(v)
        out = dev.buffer(np.full((rows, nq * HD), np.nan, np.float32))
        cb = dev.command_buffer()
        if step == "prefill":
            prep = prep_params(rows=rows, nq=nq, nkv=nkv, q_stride=q_stride, k_stride=kv_dim, v_stride=kv_dim,
                               pos_base=pos_base, max_ctx=max_ctx, eps=EPS)
            attn = attn_params(rows=rows, nq=nq, nkv=nkv, q_stride=q_stride, out_stride=nq * HD, pos_base=pos_base,
                               max_ctx=max_ctx)
            cb.dispatch(lib.kernel(f"attn_qk_norm_rope_append_{kind}"),
                        {0: qbuf, 1: kbuf, 2: vbuf, **norms, 6: kc, 7: vc, 8: prep, 9: dev.buffer(np.zeros(3, np.int32))},
                        threadgroups=(cdiv(rows * (nq + 2 * nkv), PREP_SIMDGROUPS),), threads=(PREP_SIMDGROUPS * 32,))
            cb.barrier()
            cb.dispatch(lib.kernel(f"attn_prefill_{kind}"), {0: qbuf, 1: kc, 2: vc, 3: out, 4: attn},
                        threadgroups=(cdiv(rows, 8), nkv), threads=(nq // nkv * 32,))
        else:  # flash-decode, 3 splits of 4
            n_splits = cdiv(pos_base + rows, 4)
            attn = decode_params(nq=nq, nkv=nkv, q_stride=q_stride, k_stride=kv_dim, v_stride=kv_dim,
                                 out_stride=nq * HD, max_ctx=max_ctx,
                                 cache_slot_bytes=cache_bytes(kind, max_ctx, kv_dim), n_splits=n_splits, split_len=[4],
                                 eps=EPS)
            segs = step_segments((0, rows, pos_base))
            part_o = dev.empty(rows * nq * n_splits * HD * 4)
            part_ms = dev.empty(rows * nq * n_splits * 8)
            cb.dispatch(lib.kernel(f"attn_decode_{kind}_r4"),
                        {0: qbuf, 1: kbuf, 2: vbuf, **norms, 6: kc, 7: vc, 8: part_o, 9: part_ms, 10: out, 11: segs,
                         12: attn},
                        threadgroups=(n_splits, nkv, 1), threads=(nq // nkv * 32,))
            cb.barrier()
            cb.dispatch(lib.kernel("attn_decode_combine"), {0: qbuf, 1: part_o, 2: part_ms, 3: out, 4: segs, 5: attn},
                        threadgroups=(nq, rows), threads=(COMBINE_THREADS,))
        cb.commit()
        cb.wait()
        ctx = pos_base + rows
        qg = qbuf.numpy(np.float32, q.shape)[:rows].reshape(rows, nq, 2 * HD)
        want_q = rope(rms_heads(q[:rows].reshape(rows, nq, 2 * HD)[..., :HD], q_norm, EPS),
                      pos_base + np.arange(rows), theta)
        if step == "prefill":  # prep's own normed/rotated q, checked against the math, then used as input
            ref.assert_close(qg[..., :HD], want_q, TOL_QK, "q")
            want_q = qg[..., :HD]
        else:
            assert np.array_equal(qg.view(np.uint32), q[:rows].reshape(rows, nq, 2 * HD).view(np.uint32)), \
                "decode wrote to q"
        _, kd = read_cache(kc, kind, max_ctx, kv_dim)
        _, vd = read_cache(vc, kind, max_ctx, kv_dim)
        want = attention(want_q, qg[..., HD:], kd[:ctx].reshape(ctx, nkv, HD),
                         vd[:ctx].reshape(ctx, nkv, HD), pos_base, nq, nkv)
        ref.assert_close(out.numpy(np.float32, (rows, nq, HD)), want, TOL_ATTN, f"attention rows {pos_base}..")
