#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"
// The expert projections run quant.h's matvec / GEMM bodies on one expert's slice; silu
// of norm.h.
#include "quant.h"
#include "norm.h"

// The sparse MoE MLP of Qwen3.5-MoE layers (params/moe.h has the layouts):
//   decode / verify: moe_qmv_route_silu (route + gate, up, silu) -> moe_qmv_combine (down + the
//                    weighted sum + the gated shared expert); with gate/up of different formats
//                    moe_route -> moe_qmv (gate, up) -> silu_mul -> moe_qmv (down) -> moe_combine
//   prefill:         moe_route -> moe_group -> moe_gather_rows -> moe_qmm (gate, up) -> silu_mul
//                    -> moe_qmm (down) -> moe_combine
// Expert ids never leave the GPU: the projections read them (or the grouping) from buffers.

// ---------------------------------------------------------------------------------------
// Router: softmax over the experts, then top_k rounds of a SIMD-wide argmax. Lane l holds
// experts l, l + 32, ...; a chosen expert's probability is replaced by -2 (below every
// probability and below the -1 a lane starts its search from), so it is never chosen twice.
// One SIMD-group routes one row (logits [experts]); every lane gets all top_k choices, most
// probable first: ids, and weights divided by their sum when norm_top_k != 0. moe_route and
// moe_qmv_route_silu share it, so prefill and decode route alike.
inline void moe_route_row(device const float* l, uint experts, uint top_k, uint norm_top_k, uint lane,
                          thread uint* ids, thread float* weights) {
  constexpr uint PER_LANE = MQ_MOE_MAX_EXPERTS / 32;
  float prob[PER_LANE];
  float m = -INFINITY;
  for (uint i = 0; i < PER_LANE; i++) {
    const uint e = lane + 32 * i;
    prob[i] = e < experts ? l[e] : -INFINITY;
    m = max(m, prob[i]);
  }
  m = simd_max(m);
  float sum = 0.0f;
  for (uint i = 0; i < PER_LANE; i++) {
    prob[i] = lane + 32 * i < experts ? exp(prob[i] - m) : 0.0f;
    sum += prob[i];
  }
  sum = simd_sum(sum);
  for (uint i = 0; i < PER_LANE; i++) prob[i] = prob[i] / sum;

  float total = 0.0f;
  for (uint k = 0; k < top_k; k++) {
    float best = -1.0f;
    uint best_id = experts;
    for (uint i = 0; i < PER_LANE; i++) {  // ascending ids: a lane keeps its lowest on ties
      if (lane + 32 * i < experts && prob[i] > best) {
        best = prob[i];
        best_id = lane + 32 * i;
      }
    }
    const float top = simd_max(best);
    const uint id = simd_min(best == top ? best_id : experts);
    // No expert beats -1 only when the logits hold NaN: keep the id in range, poison the weight.
    const bool found = id < experts;
    ids[k] = found ? id : k % experts;
    weights[k] = found ? top : NAN;
    total += weights[k];
    if (found && id % 32 == lane) prob[id / 32] = -2.0f;
  }
  const float scale = norm_top_k ? 1.0f / total : 1.0f;
  for (uint k = 0; k < top_k; k++) weights[k] = norm_top_k ? weights[k] * scale : weights[k];
}

[[kernel]] void moe_route(
    device const float* logits [[buffer(0)]],  // [rows][logit_stride], first `experts` used
    device uint* ids [[buffer(1)]],            // [rows][top_k]: chosen experts, most probable first
    device float* weights [[buffer(2)]],       // [rows][top_k]: their routing weights
    constant MoeRouteParams& p [[buffer(3)]],
    uint row [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  uint chosen_id[MQ_MOE_MAX_TOP_K];
  float chosen[MQ_MOE_MAX_TOP_K];
  moe_route_row(logits + (ulong)row * p.logit_stride, p.experts, p.top_k, p.norm_top_k, lane, chosen_id, chosen);
  if (lane == 0) {
    for (uint k = 0; k < p.top_k; k++) {
      ids[(ulong)row * p.top_k + k] = chosen_id[k];
      weights[(ulong)row * p.top_k + k] = chosen[k];
    }
  }
}

// ---------------------------------------------------------------------------------------
// Grouping for prefill: a counting sort of the pairs by expert in one threadgroup. Thread t
// owns experts t, t + T, ...: it counts their pairs, thread 0 turns the counts into
// offsets, then each thread lists its experts' pairs in ascending order (deterministic).
// O(experts * pairs) compares in all: a few hundred thousand for a 64-row chunk.
[[kernel]] void moe_group(
    device const uint* ids [[buffer(0)]],  // [pairs]: expert of each pair (moe_route's ids)
    device uint* offsets [[buffer(1)]],    // [experts + 1]
    device uint* order [[buffer(2)]],      // [pairs]: pair indices grouped by expert
    device uint* slot [[buffer(3)]],       // [pairs]: position of each pair in order
    constant MoeGroupParams& p [[buffer(4)]],
    uint tid [[thread_index_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
  threadgroup uint start[MQ_MOE_MAX_EXPERTS + 1];
  if (tid == 0) start[0] = 0;
  for (uint e = tid; e < p.experts; e += threads) {
    uint count = 0;
    for (uint q = 0; q < p.pairs; q++) count += ids[q] == e ? 1u : 0u;
    start[e + 1] = count;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0)
    for (uint e = 0; e < p.experts; e++) start[e + 1] += start[e];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e <= p.experts; e += threads) offsets[e] = start[e];
  for (uint e = tid; e < p.experts; e += threads) {
    uint n = start[e];
    for (uint q = 0; q < p.pairs; q++) {
      if (ids[q] == e) {
        order[n] = q;
        slot[q] = n;
        n++;
      }
    }
  }
}

// Each pair's input row in grouped order, so that an expert's rows are contiguous for moe_qmm.
[[kernel]] void moe_gather_rows(
    device const float* src [[buffer(0)]],  // [rows][src_stride]: one row per token
    device const uint* order [[buffer(1)]], // [pairs]: moe_group's order
    device float* dst [[buffer(2)]],        // [pairs][dst_stride]
    constant MoeGatherParams& p [[buffer(3)]],
    uint2 gid [[thread_position_in_grid]]) {
  const uint i = gid.x * 4;
  if (i >= p.dim || gid.y >= p.pairs) return;
  const uint row = order[gid.y] / p.top_k;
  *(device float4*)(dst + (ulong)gid.y * p.dst_stride + i) =
      *(device const float4*)(src + (ulong)row * p.src_stride + i);
}

// ---------------------------------------------------------------------------------------
// Expert projections. Expert e's slice of the stacked weight starts e * out_dim rows in.

template <typename Fmt>
[[kernel]] void moe_qmv(
    device const uint* w [[buffer(0)]],                         // [experts][out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [experts][out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [experts][out_dim][in_dim/GROUP]
    device const uint* ids [[buffer(3)]],                       // [pairs]: expert of each pair
    device const float* x [[buffer(4)]],                        // [pairs / x_pairs][x_stride]
    device float* y [[buffer(5)]],                              // [pairs][y_stride], first out_dim written
    constant MoeMatmulParams& p [[buffer(6)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  const uint q = tg.y;
  const ulong e = min(ids[q], p.experts - 1);  // moe_route writes ids < experts; never read past the stack
  qmv_body<Fmt>(w, scales, biases, x + (ulong)(q / p.x_pairs) * p.x_stride, y + (ulong)q * p.y_stride, p.in_dim,
                p.out_dim, e * p.out_dim, tg.x, sg, lane);
}

template <typename Fmt>
[[kernel]] void moe_qmm(
    device const uint* w [[buffer(0)]],                         // [experts][out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [experts][out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [experts][out_dim][in_dim/GROUP]
    device const uint* offsets [[buffer(3)]],                   // [experts + 1]: moe_group's offsets
    device const float* x [[buffer(4)]],                        // [pairs][x_stride], grouped by expert
    device float* y [[buffer(5)]],                              // [pairs][y_stride], same order
    constant MoeMatmulParams& p [[buffer(6)]],
    uint3 tg [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float4 smem[QMM_SMEM_FLOAT4S];
  const uint first = offsets[tg.z];
  const uint count = offsets[tg.z + 1] - first;
  if (tg.x * MQ_QMM_TILE_ROWS >= count) return;  // uniform: past this expert's rows
  const QuantMatmulParams mp{p.in_dim, p.out_dim, count, p.x_stride, p.y_stride};
  qmm_tile<Fmt>(w, scales, biases, x + (ulong)first * p.x_stride, y + (ulong)first * p.y_stride, mp,
                (ulong)tg.z * p.out_dim, smem, uint2(tg.x, tg.y), tid, sg);
}

// ---------------------------------------------------------------------------------------
// Weighted sum of the chosen experts' outputs (slot order, as the router ranked them),
// plus the shared expert scaled by its sigmoid gate.
[[kernel]] void moe_combine(
    device const float* expert_out [[buffer(0)]],  // [pairs][eo_stride]
    device const uint* slot [[buffer(1)]],         // [pairs]: row of each pair (grouped only)
    device const float* weights [[buffer(2)]],     // [rows][top_k]
    device const float* shared_gate [[buffer(3)]], // [rows][gate_stride]: shared_expert_gate logit
    device float* y [[buffer(4)]],                 // [rows][y_stride]: shared expert in, MLP out
    constant MoeCombineParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]) {
  const uint i = gid.x * 4, r = gid.y;
  if (i >= p.dim || r >= p.rows) return;
  float4 acc = 0.0f;
  for (uint s = 0; s < p.top_k; s++) {
    const uint q = r * p.top_k + s;
    const uint at = p.grouped ? slot[q] : q;
    acc = fma(float4(weights[q]), *(device const float4*)(expert_out + (ulong)at * p.eo_stride + i), acc);
  }
  const float gate = 1.0f / (1.0f + exp(-shared_gate[(ulong)r * p.gate_stride]));
  device float4* out = (device float4*)(y + (ulong)r * p.y_stride + i);
  *out = acc + gate * *out;
}

// ---------------------------------------------------------------------------------------
// The decode/verify block (params/moe.h): the experts' gate/up with the routing in front and
// silu in the epilogue, then their down with the weighted sum and the shared expert folded in.
// Each is quant.h's walk over one expert's slice for one activation row, so a pair's
// values do not depend on the step's row count.

template <typename Fmt>
[[kernel]] void moe_qmv_route_silu(
    device const uint* gate_w [[buffer(0)]],                    // [experts][out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* gate_s [[buffer(1)]],  // [experts][out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* gate_b [[buffer(2)]],  // [experts][out_dim][in_dim/GROUP]
    device const uint* up_w [[buffer(3)]],                      // [experts][out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* up_s [[buffer(4)]],    // [experts][out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* up_b [[buffer(5)]],    // [experts][out_dim][in_dim/GROUP]
    device const float* logits [[buffer(6)]],  // [rows][logit_stride]: router logits, first `experts` used
    device const float* x [[buffer(7)]],       // [rows][x_stride]: the normed rows
    device float* act [[buffer(8)]],           // [rows * top_k][act_stride], first out_dim written
    device uint* ids [[buffer(9)]],            // [rows * top_k]: each pair's expert
    device float* weights [[buffer(10)]],      // [rows * top_k]: its routing weight
    constant MoeRouteSiluParams& p [[buffer(11)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int R = MQ_QMV_ROWS_PER_SIMDGROUP, HALF = R / 2;
  const uint q = tg.y, row = q / p.top_k, slot = q % p.top_k;
  // A few hundred floats per SIMD-group: cheaper than a route dispatch and its barrier.
  uint route_ids[MQ_MOE_MAX_TOP_K];
  float route_weights[MQ_MOE_MAX_TOP_K];
  moe_route_row(logits + (ulong)row * p.logit_stride, p.experts, p.top_k, p.norm_top_k, lane, route_ids,
                route_weights);
  const uint e = route_ids[slot];  // < experts, even for NaN logits
  if (tg.x == 0 && sg == 0 && lane == 0) {
    ids[q] = e;
    weights[q] = route_weights[slot];
  }
  const uint row0 = qmv_first_row(tg.x, sg, HALF);
  if (row0 >= p.out_dim) return;  // uniform over the SIMD-group (never threadgroup 0's first)
  ulong rows[R];
  qmv_clamped_rows<HALF>((ulong)e * p.out_dim, row0, p.out_dim, rows);
  qmv_clamped_rows<HALF>((ulong)e * p.out_dim, row0, p.out_dim, rows + HALF);
  float acc[R];
  for (int i = 0; i < R; i++) acc[i] = 0.0f;
  const QuantWeights<Fmt> gate{gate_w, gate_s, gate_b}, up{up_w, up_s, up_b};
  PlainRows xs{x + (ulong)row * p.x_stride, 0};
  qmv_walk<Fmt, 1, R, HALF>(gate, up, rows, p.in_dim / QBLOCK, 1, lane, xs, acc);
  for (int i = 0; i < HALF; i++) {
    const float g = simd_sum(acc[i]), u = simd_sum(acc[HALF + i]);
    if (lane == 0 && row0 + i < p.out_dim) act[(ulong)q * p.act_stride + row0 + i] = mq_norm::silu(g) * u;
  }
}

template <typename Fmt>
[[kernel]] void moe_qmv_combine(
    device const uint* w [[buffer(0)]],                         // [experts][out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [experts][out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [experts][out_dim][in_dim/GROUP]
    device const uint* ids [[buffer(3)]],             // [rows * top_k]: each pair's expert
    device const float* weights [[buffer(4)]],        // [rows * top_k]: its routing weight
    device const float* act [[buffer(5)]],            // [rows * top_k][act_stride]: each pair's activation
    device const float* shared_gate [[buffer(6)]],    // [rows][gate_stride]: shared_expert_gate logit
    device float* y [[buffer(7)]],                    // [rows][y_stride]: shared expert in, MLP out
    constant MoeCombineQmvParams& p [[buffer(8)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int R = MQ_QMV_ROWS_PER_SIMDGROUP;
  const uint r = tg.y;
  const uint row0 = qmv_first_row(tg.x, sg, R);
  if (row0 >= p.out_dim) return;  // uniform over the SIMD-group
  const QuantWeights<Fmt> m{w, scales, biases};
  float out[R];
  for (int i = 0; i < R; i++) out[i] = 0.0f;
  for (uint s = 0; s < p.top_k; s++) {  // slot order, as moe_combine sums
    const uint q = r * p.top_k + s;
    const ulong e = min(ids[q], p.experts - 1);  // never read past the stack
    ulong rows[R];
    qmv_clamped_rows<R>(e * p.out_dim, row0, p.out_dim, rows);
    float acc[R];
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
    PlainRows xs{act + (ulong)q * p.act_stride, 0};
    qmv_walk<Fmt, 1, R, R>(m, m, rows, p.in_dim / QBLOCK, 1, lane, xs, acc);
    const float weight = weights[q];
    for (int i = 0; i < R; i++) out[i] = fma(weight, simd_sum(acc[i]), out[i]);
  }
  const float gate = 1.0f / (1.0f + exp(-shared_gate[(ulong)r * p.gate_stride]));
  for (int i = 0; i < R; i++) {
    if (lane == 0 && row0 + i < p.out_dim) {
      device float* o = y + (ulong)r * p.y_stride + row0 + i;
      *o = out[i] + gate * *o;
    }
  }
}
