"""shaders/moe.metal: the sparse MoE MLP's kernels against float64 numpy.

Router (softmax + top-k, ties to the lower expert id, with and without renormalisation),
the counting sort of (row, slot) pairs by expert (an expert with no pairs, one with every
row), the row gather, the gathered expert matvec (decode and verify rows, x per token or
per pair) and the grouped expert GEMM on stacked [experts][out][in] weights, and the
weighted combine with the sigmoid-gated shared expert. Outputs start as NaN; the
projections use quant.metal's tolerance (tol_f32_dot).
"""

import numpy as np
import pytest

from ..support import reference as ref
from ..support.require import require
from .params import header_constants
from .quant_reference import (FORMATS, QMM_THREADS, QMM_TILE_OUT, QMM_TILE_ROWS, QMV_ROWS_PER_TG, QMV_THREADS,
                              activations, cdiv, format_weights, matmul_ref, seeded, tol_f32_dot)

C = header_constants("moe")
ROUTE_THREADS = C["MQ_MOE_ROUTE_THREADS"]
GROUP_THREADS = C["MQ_MOE_GROUP_THREADS"]


@pytest.fixture(scope="module")
def lib(shaders):
    require("mlx.core")  # the expert weights are quantized by mlx
    return shaders("moe.metal", "norm.metal", "quant.metal")


def u32(*values) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def nan_buffer(dev, *shape):
    return dev.buffer(np.full(shape, np.nan, dtype=np.float32))


# ---------------------------------------------------------------------------
# Router


def route_reference(logits, k, norm):
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    # Stable sort of -p: equal probabilities keep ascending expert ids.
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if norm:
        w /= w.sum(-1, keepdims=True)
    return ids, w


def run_route(dev, lib, logits, k, norm, stride=None):
    rows, experts = logits.shape
    stride = stride or experts
    padded = np.full((rows, stride), np.nan, np.float32)
    padded[:, :experts] = logits
    ids = dev.buffer(np.full((rows, k), 0xFFFFFFFF, np.uint32))
    w = nan_buffer(dev, rows, k)
    lib.kernel("moe_route").dispatch({0: dev.buffer(padded), 1: ids, 2: w, 3: u32(experts, k, stride, norm)},
                                     threadgroups=(rows,), threads=(ROUTE_THREADS,))
    return ids.numpy(np.uint32, (rows, k)), w.numpy(np.float32, (rows, k))


@pytest.mark.parametrize("experts,k", [(1, 1), (8, 2), (8, 3), (33, 8), (256, 8), (512, 10), (64, 16)])
@pytest.mark.parametrize("norm", [1, 0])
def test_route_top_k(dev, lib, experts, k, norm):
    rng = seeded("route", experts, k, norm)
    logits = (rng.standard_normal((5, experts)) * 3).astype(np.float32)
    ids, w = run_route(dev, lib, logits, k, norm, stride=experts + 3)
    want_ids, want_w = route_reference(logits, k, norm)
    np.testing.assert_array_equal(ids, want_ids)
    ref.assert_close(w, want_w, 1e-6, "routing weights")


def test_route_ties_go_to_the_lower_expert(dev, lib):
    logits = np.zeros((3, 40), np.float32)
    logits[1, [3, 7, 35, 36]] = 2.0  # four-way tie for the top, across lanes and wraps
    logits[2, [39, 5]] = [1.0, 1.0]
    ids, w = run_route(dev, lib, logits, 3, 1)
    assert ids.tolist() == [[0, 1, 2], [3, 7, 35], [5, 39, 0]]
    ref.assert_close(w, route_reference(logits, 3, 1)[1], 1e-6, "tied weights")


def test_route_nan_logits_keep_ids_in_range(dev, lib):
    logits = np.full((1, 16), np.nan, np.float32)
    ids, w = run_route(dev, lib, logits, 4, 1)
    assert (ids < 16).all() and np.isnan(w).all()


# ---------------------------------------------------------------------------
# Grouping by expert


def run_group(dev, lib, ids, experts, threads=GROUP_THREADS):
    pairs = ids.size
    offsets = dev.buffer(np.full(experts + 1, 0xFFFFFFFF, np.uint32))
    order = dev.buffer(np.full(pairs, 0xFFFFFFFF, np.uint32))
    slot = dev.buffer(np.full(pairs, 0xFFFFFFFF, np.uint32))
    lib.kernel("moe_group").dispatch({0: dev.buffer(ids.astype(np.uint32).reshape(-1)), 1: offsets, 2: order,
                                      3: slot, 4: u32(experts, pairs)}, threadgroups=(1,), threads=(threads,))
    return offsets.numpy(np.uint32, (experts + 1,)), order.numpy(np.uint32, (pairs,)), slot.numpy(np.uint32, (pairs,))


def routed_ids(rng, rows, k, experts):
    """Distinct experts per row (as top-k gives); expert 0 in every row, the last in none."""
    ids = np.empty((rows, k), np.int64)
    for r in range(rows):
        ids[r] = np.concatenate([[0], 1 + rng.choice(experts - 2, k - 1, replace=False)])
        rng.shuffle(ids[r])
    return ids


@pytest.mark.parametrize("rows,k,experts,threads", [(1, 1, 3, 32), (64, 2, 8, 256), (40, 8, 300, 64),
                                                    (9, 10, 512, 256)])
def test_group_is_a_stable_counting_sort(dev, lib, rows, k, experts, threads):
    ids = routed_ids(seeded("group", rows, k, experts), rows, k, experts)
    offsets, order, slot = run_group(dev, lib, ids, experts, threads)
    flat = ids.reshape(-1)
    want_order = np.argsort(flat, kind="stable")
    np.testing.assert_array_equal(order, want_order)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=experts))]))
    np.testing.assert_array_equal(slot[order], np.arange(flat.size))
    assert offsets[1] - offsets[0] == rows and offsets[-1] - offsets[-2] == 0


def test_gather_rows(dev, lib):
    rows, k, dim = 5, 3, 36
    rng = seeded("gather")
    src = rng.standard_normal((rows, dim + 4)).astype(np.float32)
    order = rng.permutation(rows * k).astype(np.uint32)
    dst = nan_buffer(dev, rows * k, dim + 8)
    lib.kernel("moe_gather_rows").dispatch_threads(
        {0: dev.buffer(src), 1: dev.buffer(order), 2: dst, 3: u32(dim, rows * k, k, dim + 4, dim + 8)},
        grid=(dim // 4, rows * k), threads=(4, 4))
    got = dst.numpy(np.float32, (rows * k, dim + 8))
    assert np.array_equal(got[:, :dim], src[order // k, :dim])
    ref.assert_untouched(got[:, dim:], "dst row padding")


# ---------------------------------------------------------------------------
# Expert projections


def stacked_experts(dev, rng, fmt, experts, out_dim, in_dim):
    """[experts][out][..] weights of format ``fmt`` (quantized by mlx) as the checkpoint stacks
    them: the kernels' buffers 0-2 (the weights where a format has no scales/biases) and each
    expert's dequantized [out, in]."""
    parts = [format_weights(rng, fmt, out_dim, in_dim) for _ in range(experts)]
    words = dev.buffer(np.stack([p[0] for p in parts]))
    stacked = [dev.buffer(np.stack([p[i] for p in parts])) if parts[0][i] is not None else words for i in (1, 2)]
    return {0: words, 1: stacked[0], 2: stacked[1]}, [p[3] for p in parts]


def matmul_params(in_dim, out_dim, experts, x_pairs, x_stride, y_stride):
    return u32(in_dim, out_dim, experts, x_pairs, x_stride, y_stride)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,k,per_pair", [(1, 2, False), (1, 8, True), (5, 3, False), (8, 2, True)])
def test_gathered_matvec(dev, lib, fmt, rows, k, per_pair):
    experts, out_dim, in_dim = 9, 33, 384
    rng = seeded("moe_qmv", fmt, rows, k, per_pair)
    weights, values = stacked_experts(dev, rng, fmt, experts, out_dim, in_dim)
    ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(rows)]).astype(np.uint32)
    pairs = rows * k
    x = activations(rng, pairs if per_pair else rows, in_dim)
    x_stride, y_stride = in_dim + 4, out_dim + 3
    xb = np.zeros((x.shape[0], x_stride), np.float32)
    xb[:, :in_dim] = x
    y = nan_buffer(dev, pairs, y_stride)
    lib.kernel(f"moe_qmv_{fmt}").dispatch(
        {**weights, 3: dev.buffer(ids.reshape(-1)), 4: dev.buffer(xb), 5: y,
         6: matmul_params(in_dim, out_dim, experts, 1 if per_pair else k, x_stride, y_stride)},
        threadgroups=(cdiv(out_dim, QMV_ROWS_PER_TG), pairs), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (pairs, y_stride))
    ref.assert_untouched(got[:, out_dim:], "y row padding")
    for q, e in enumerate(ids.reshape(-1)):
        xq = x[q] if per_pair else x[q // k]
        want, typical = matmul_ref(values[e], xq)
        ref.assert_close(got[q, :out_dim], want[0], tol_f32_dot(in_dim), f"pair {q} (expert {e})", scale=typical)


@pytest.mark.parametrize("fmt", ["b4_g64", "b8_g32", "b3_g128", "b6_g64_sf32", "mxfp4", "nvfp4", "mxfp8", "bf16"])
@pytest.mark.parametrize("rows,k,experts", [(40, 2, 8), (64, 3, 5), (9, 1, 4)])
def test_grouped_gemm(dev, lib, fmt, rows, k, experts):
    """Pairs grouped by moe_group on the device; expert 0 gets every row, the last none."""
    out_dim, in_dim = 70, 256
    rng = seeded("moe_qmm", fmt, rows, k, experts)
    weights, values = stacked_experts(dev, rng, fmt, experts, out_dim, in_dim)
    ids = routed_ids(rng, rows, k, experts) if k > 1 else np.zeros((rows, 1), np.int64)
    pairs = rows * k
    offsets, order, _ = run_group(dev, lib, ids, experts)
    x = activations(rng, pairs, in_dim)  # already in grouped order
    y_stride = out_dim + 2
    y = nan_buffer(dev, pairs, y_stride)
    lib.kernel(f"moe_qmm_{fmt}").dispatch(
        {**weights, 3: dev.buffer(offsets), 4: dev.buffer(x), 5: y,
         6: matmul_params(in_dim, out_dim, experts, 1, in_dim, y_stride)},
        threadgroups=(cdiv(rows, QMM_TILE_ROWS), cdiv(out_dim, QMM_TILE_OUT), experts), threads=(QMM_THREADS,))
    got = y.numpy(np.float32, (pairs, y_stride))
    ref.assert_untouched(got[:, out_dim:], "y row padding")
    expert_of = ids.reshape(-1)[order]
    for e in range(experts):
        sel = np.flatnonzero(expert_of == e)
        if sel.size:
            want, typical = matmul_ref(values[e], x[sel])
            ref.assert_close(got[sel, :out_dim], want, tol_f32_dot(in_dim), f"expert {e}", scale=typical)


# ---------------------------------------------------------------------------
# Combine


@pytest.mark.parametrize("grouped", [0, 1])
def test_combine(dev, lib, grouped):
    rows, k, dim = 6, 3, 40
    rng = seeded("combine", grouped)
    pairs = rows * k
    eo = rng.standard_normal((pairs, dim + 4)).astype(np.float32)
    slot = rng.permutation(pairs).astype(np.uint32) if grouped else np.zeros(pairs, np.uint32)
    w = rng.uniform(0, 1, (rows, k)).astype(np.float32)
    gate = (rng.standard_normal((rows, 2)) * 3).astype(np.float32)
    shared = rng.standard_normal((rows, dim + 8)).astype(np.float32)
    y = dev.buffer(shared)
    lib.kernel("moe_combine").dispatch_threads(
        {0: dev.buffer(eo), 1: dev.buffer(slot), 2: dev.buffer(w), 3: dev.buffer(gate), 4: y,
         5: u32(dim, rows, k, grouped, dim + 4, dim + 8, 2)}, grid=(dim // 4, rows), threads=(8, 2))
    got = y.numpy(np.float32, (rows, dim + 8))
    at = (slot if grouped else np.arange(pairs)).reshape(rows, k)
    routed = np.einsum("rk,rkd->rd", w.astype(np.float64), eo[at][:, :, :dim].astype(np.float64))
    want = routed + shared[:, :dim] / (1 + np.exp(-gate[:, :1].astype(np.float64)))
    ref.assert_close(got[:, :dim], want, 1e-6, "combined")
    assert np.array_equal(got[:, dim:], shared[:, dim:])


# ---------------------------------------------------------------------------
# The fused decode/verify block: routing + gate/up + silu per pair, down + combine per row


SILU_ROWS_PER_TG = header_constants("moe")["MQ_MOE_SILU_ROWS_PER_THREADGROUP"]
MAX_ROWS = header_constants("quant")["MQ_QMV_MAX_ROWS"]


def run_route_silu(dev, lib, fmt, gate, up, logits, x, k, norm, out_dim, lib_dev=None):
    """moe_qmv_route_silu over every (row, slot) pair: (act [pairs][out_dim], ids, weights)."""
    rows, experts = logits.shape
    in_dim = x.shape[1]
    logit_stride, x_stride, act_stride = experts + 3, in_dim + 4, out_dim + 5
    lp = np.full((rows, logit_stride), np.nan, np.float32)
    lp[:, :experts] = logits
    xp = np.full((rows, x_stride), np.nan, np.float32)
    xp[:, :in_dim] = x
    pairs = rows * k
    act = nan_buffer(dev, pairs, act_stride)
    ids = dev.buffer(np.full(pairs, 0xFFFFFFFF, np.uint32))
    w = nan_buffer(dev, pairs)
    lib.kernel(f"moe_qmv_route_silu_{fmt}").dispatch(
        {0: gate[0], 1: gate[1], 2: gate[2], 3: up[0], 4: up[1], 5: up[2], 6: dev.buffer(lp), 7: dev.buffer(xp),
         8: act, 9: ids, 10: w, 11: u32(in_dim, out_dim, experts, k, norm, logit_stride, x_stride, act_stride)},
        threadgroups=(cdiv(out_dim, SILU_ROWS_PER_TG), pairs), threads=(QMV_THREADS,))
    got = act.numpy(np.float32, (pairs, act_stride))
    ref.assert_untouched(got[:, out_dim:], "act row padding")
    return got[:, :out_dim], ids.numpy(np.uint32, (pairs,)), w.numpy(np.float32, (pairs,))


ROUTE_SILU_CASES = [("b4_g64", 1, 8, 2, 1), ("b8_g32", 3, 40, 3, 0), ("mxfp4", 8, 9, 4, 1), ("nvfp4", 2, 33, 8, 0),
                    ("bf16", 5, 16, 1, 1), ("b3_g128", 7, 12, 5, 1), ("b6_g64_sf32", 4, 8, 2, 0),
                    ("mxfp8", 1, 512, 10, 1), ("f32", 2, 64, 16, 1)]


@pytest.mark.parametrize("fmt,rows,experts,k,norm", ROUTE_SILU_CASES,
                         ids=[f"{f}-{r}rows-{e}top{k}-n{n}" for f, r, e, k, n in ROUTE_SILU_CASES])
def test_route_silu(dev, lib, fmt, rows, experts, k, norm):
    """Each pair routes its row exactly as moe_route (ids, weights) and gets silu(gate_e x) * (up_e x)."""
    out_dim, in_dim = 37, 384  # 37: a partial last threadgroup (8 rows of gate/up pairs each)
    rng = seeded("moe_route_silu", fmt, rows, experts, k, norm)
    # Only the chosen experts are read: quantize a few distinct ones and repeat them over the stack.
    distinct = min(experts, 6)
    gate_parts = [format_weights(rng, fmt, out_dim, in_dim) for _ in range(distinct)]
    up_parts = [format_weights(rng, fmt, out_dim, in_dim) for _ in range(distinct)]

    def stack(parts):
        words = dev.buffer(np.stack([parts[e % distinct][0] for e in range(experts)]))
        return [words] + [dev.buffer(np.stack([parts[e % distinct][i] for e in range(experts)]))
                          if parts[0][i] is not None else words for i in (1, 2)]

    gate, up = stack(gate_parts), stack(up_parts)
    logits = (rng.standard_normal((rows, experts)) * 3).astype(np.float32)
    x = activations(rng, rows, in_dim)
    act, ids, w = run_route_silu(dev, lib, fmt, gate, up, logits, x, k, norm, out_dim)
    want_ids, want_w = route_reference(logits, k, norm)
    np.testing.assert_array_equal(ids.reshape(rows, k), want_ids)
    ref.assert_close(w.reshape(rows, k), want_w, 1e-6, "routing weights")
    # The route is moe_route's, bit for bit.
    route_ids, route_w = run_route(dev, lib, logits, k, norm)
    assert np.array_equal(ids, route_ids.reshape(-1)) and np.array_equal(w.view(np.uint32), route_w.reshape(-1).view(np.uint32))
    for q, e in enumerate(ids):
        g, g_typ = matmul_ref(gate_parts[e % distinct][3], x[q // k])
        u, u_typ = matmul_ref(up_parts[e % distinct][3], x[q // k])
        want = g / (1.0 + np.exp(-g)) * u
        # Each factor carries a dot product's rounding; silu' <= 1.1 bounds how silu passes its share on.
        ref.assert_close(act[q], want[0], 2.2 * tol_f32_dot(in_dim), f"pair {q} (expert {e})", scale=g_typ * u_typ)


def run_combine_qmv(dev, lib, fmt, down, ids, weights, act, shared_gate, shared):
    """moe_qmv_combine over every row: the MLP output [rows][out_dim]."""
    rows, k = ids.shape
    in_dim, out_dim, experts = act.shape[1], shared.shape[1], down[3]
    act_stride, gate_stride, y_stride = in_dim + 4, 3, out_dim + 2
    ap = np.full((rows * k, act_stride), np.nan, np.float32)
    ap[:, :in_dim] = act
    gp = np.full((rows, gate_stride), np.nan, np.float32)
    gp[:, 0] = shared_gate
    yp = np.full((rows, y_stride), np.nan, np.float32)
    yp[:, :out_dim] = shared
    y = dev.buffer(yp)
    lib.kernel(f"moe_qmv_combine_{fmt}").dispatch(
        {0: down[0], 1: down[1], 2: down[2], 3: dev.buffer(ids.astype(np.uint32).reshape(-1)),
         4: dev.buffer(weights.astype(np.float32).reshape(-1)), 5: dev.buffer(ap), 6: dev.buffer(gp), 7: y,
         8: u32(in_dim, out_dim, experts, k, act_stride, gate_stride, y_stride)},
        threadgroups=(cdiv(out_dim, QMV_ROWS_PER_TG), rows), threads=(QMV_THREADS,))
    got = y.numpy(np.float32, (rows, y_stride))
    ref.assert_untouched(got[:, out_dim:], "y row padding")
    return got[:, :out_dim]


COMBINE_CASES = [("b4_g64", 1, 2), ("b8_g32", 3, 3), ("mxfp4", 8, 4), ("nvfp4", 2, 8), ("bf16", 5, 1),
                 ("b5_g128", 7, 2), ("b2_g64_sf32", 4, 3), ("mxfp8", 1, 10), ("f16", 6, 2)]


@pytest.mark.parametrize("fmt,rows,k", COMBINE_CASES, ids=[f"{f}-{r}rows-top{k}" for f, r, k in COMBINE_CASES])
def test_combine_qmv(dev, lib, fmt, rows, k):
    """y[r] = sum_s w[r,s] down_{e[r,s]} act[r*k+s] + sigmoid(gate[r]) shared[r]."""
    experts, out_dim, in_dim = 11, 45, 256  # 45: a partial last threadgroup
    rng = seeded("moe_combine_qmv", fmt, rows, k)
    weights_dev, values = stacked_experts(dev, rng, fmt, experts, out_dim, in_dim)
    down = (weights_dev[0], weights_dev[1], weights_dev[2], experts)
    ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(rows)])
    w = rng.uniform(0, 1, (rows, k)).astype(np.float32)
    act = activations(rng, rows * k, in_dim)
    gate = (rng.standard_normal(rows) * 3).astype(np.float32)
    shared = rng.standard_normal((rows, out_dim)).astype(np.float32)
    got = run_combine_qmv(dev, lib, fmt, down, ids, w, act, gate, shared)
    for r in range(rows):
        routed, typical = np.zeros(out_dim), 0.0
        for s in range(k):
            y, t = matmul_ref(values[ids[r, s]], act[r * k + s])
            routed += w[r, s] * y[0]
            typical = max(typical, t)
        want = routed + shared[r].astype(np.float64) / (1 + np.exp(-np.float64(gate[r])))
        ref.assert_close(got[r], want, k * tol_f32_dot(in_dim), f"row {r}", scale=typical)


@pytest.mark.parametrize("fmt", ["b4_g64", "b8_g32", "mxfp4", "nvfp4", "bf16", "b6_g64_sf32"])
def test_fused_block_rows_match_one_row_bitwise(dev, lib, fmt):
    """A verify step's rows (2..8) get exactly what a one-row decode step gives each of them, in
    routing, activations and the combined output (speculative decoding reproduces greedy)."""
    rows, experts, k, inter, hidden = MAX_ROWS, 12, 3, 128, 128
    rng = seeded("moe_fused_bitwise", fmt)
    gate, _ = stacked_experts(dev, rng, fmt, experts, inter, hidden)
    up, _ = stacked_experts(dev, rng, fmt, experts, inter, hidden)
    down_w, _ = stacked_experts(dev, rng, fmt, experts, hidden, inter)
    down = (down_w[0], down_w[1], down_w[2], experts)
    logits = (rng.standard_normal((rows, experts)) * 2).astype(np.float32)
    x = activations(rng, rows, hidden)
    shared_gate = rng.standard_normal(rows).astype(np.float32)
    shared = rng.standard_normal((rows, hidden)).astype(np.float32)
    gate_l, up_l = [gate[i] for i in range(3)], [up[i] for i in range(3)]
    act, ids, w = run_route_silu(dev, lib, fmt, gate_l, up_l, logits, x, k, 1, inter)
    out = run_combine_qmv(dev, lib, fmt, down, ids.reshape(rows, k), w.reshape(rows, k), act, shared_gate, shared)
    for r in range(rows):
        one = slice(r, r + 1)
        a1, i1, w1 = run_route_silu(dev, lib, fmt, gate_l, up_l, logits[one], x[one], k, 1, inter)
        assert np.array_equal(i1, ids[r * k:(r + 1) * k]), f"row {r}: ids differ"
        assert np.array_equal(w1.view(np.uint32), w[r * k:(r + 1) * k].view(np.uint32)), f"row {r}: weights differ"
        assert np.array_equal(a1.view(np.uint32), act[r * k:(r + 1) * k].view(np.uint32)), f"row {r}: act differs"
        o1 = run_combine_qmv(dev, lib, fmt, down, i1.reshape(1, k), w1.reshape(1, k), a1, shared_gate[one],
                             shared[one])
        assert np.array_equal(o1.view(np.uint32), out[one].view(np.uint32)), f"row {r}: combined output differs"


def test_fused_block_has_no_races_or_stray_accesses():
    """Under the CPU runtime's race and bounds checks: one threadgroup per pair writes its route,
    every threadgroup of a pair recomputes it; each output element has one writer."""
    from metalqwen import gpu

    from .conftest import compiled_kernels

    dev = gpu.Device("cpu", checks=("races", "bounds"))
    lib = compiled_kernels(dev, "moe.metal", "norm.metal", "quant.metal")
    rng = seeded("moe_fused_checks")
    rows, experts, k, inter, hidden = 3, 40, 3, 32, 64
    gate, _ = stacked_experts(dev, rng, "b4_g32", experts, inter, hidden)
    up, _ = stacked_experts(dev, rng, "b4_g32", experts, inter, hidden)
    down_w, _ = stacked_experts(dev, rng, "b4_g32", experts, hidden, inter)
    logits = rng.standard_normal((rows, experts)).astype(np.float32)
    act, ids, w = run_route_silu(dev, lib, "b4_g32", [gate[i] for i in range(3)], [up[i] for i in range(3)], logits,
                                 activations(rng, rows, hidden), k, 0, inter)
    out = run_combine_qmv(dev, lib, "b4_g32", (down_w[0], down_w[1], down_w[2], experts), ids.reshape(rows, k),
                          w.reshape(rows, k), act, np.zeros(rows, np.float32), np.ones((rows, hidden), np.float32))
    assert np.isfinite(out).all()
