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

from .. import reference as ref
from ..conftest import require
from .params import header_constants
from .quant_reference import (FORMATS, QMM_THREADS, QMM_TILE_OUT, QMM_TILE_ROWS, QMV_ROWS_PER_TG, QMV_THREADS,
                              activations, cdiv, format_weights, matmul_ref, seeded, tol_f32_dot)

C = header_constants("moe")
ROUTE_THREADS = C["MQ_MOE_ROUTE_THREADS"]
GROUP_THREADS = C["MQ_MOE_GROUP_THREADS"]


@pytest.fixture(scope="module")
def lib(shaders):
    require("mlx.core")  # the expert weights are quantized by mlx
    return shaders("moe.metal", "quant.metal")


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
