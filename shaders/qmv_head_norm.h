#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"
// The walk and the formats of quant.h; the gated norm's factor of deltanet.h.
#include "quant.h"
#include "deltanet.h"

// DeltaNet's out_proj in decode and verify steps with the gated output norm's per-head factor
// folded into its input load (params/quant.h, QmvHeadNormParams): delta_conv_scan leaves
// g = y * norm_w * silu(z) and each head's partial sums of y^2, and since a block of
// MQ_QUANT_BLOCK inputs lies inside one head, the walk scales each block it loads by its
// head's factor: no norm dispatch and no barrier between the scan and out_proj.
//   qmv_head_norm[_rows|_deep]  y[r] = W (g[r] * f[r]), f[r] = mq_delta::head_norm_inv per head
// The block's values are g * f exactly as delta_norm_history leaves them in place (one
// multiply, the same factor), so a row gives the bits of that kernel followed by qmv[_rows];
// *_rows take 1..MQ_QMV_SMALL_ROWS rows, *_deep 1..MQ_QMV_MAX_ROWS, with one weight stream, a
// verify row bit-identical to the one-row kernel's.
static_assert(MQ_DELTA_HEAD_DIM % MQ_QUANT_BLOCK == 0, "a walk block must lie inside one head");

// Rows of g with their heads' factors, formed per block from head_ss as the walk loads it.
struct HeadNormedRows {
  device const float* g;        // [rows][stride]
  device const float* head_ss;  // [rows][ss_stride]: head h's partials at h * MQ_DELTA_HEAD_PARTIALS
  uint stride, ss_stride;
  float eps;
  // Block blk of row r, times its head's factor, into xv (8 float4s); returns its sum (load_x).
  float load(uint r, uint blk, thread float4* xv) const {
    const uint e = blk * QBLOCK;
    const uint head = e / MQ_DELTA_HEAD_DIM;
    const float f = mq_delta::head_norm_inv(head_ss + (ulong)r * ss_stride + head * MQ_DELTA_HEAD_PARTIALS, eps);
    device const float4* g4 = (device const float4*)(g + (ulong)r * stride + e);
    float4 sum = 0.0f;
    for (uint i = 0; i < QBLOCK / 4; i++) {
      xv[i] = g4[i] * f;
      sum += xv[i];
    }
    return (sum.x + sum.y) + (sum.z + sum.w);
  }
};

// ---------------------------------------------------------------------------------------
// y[r] = W (g[r] * f[r]) for r < min(p.rows, M): M = 1 (qmv_head_norm, decode),
// MQ_QMV_SMALL_ROWS (qmv_head_norm_rows) or MQ_QMV_MAX_ROWS (qmv_head_norm_deep, verify);
// grid and threadgroups as qmv's R variant.
template <typename Fmt, int M, int R>
[[kernel]] void qmv_head_norm(
    device const uint* w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* g [[buffer(3)]],                        // [rows][x_stride], first in_dim used
    device const float* head_ss [[buffer(4)]],                  // [rows][ss_stride]
    device float* y [[buffer(5)]],                              // [rows][y_stride], first out_dim written
    constant QmvHeadNormParams& p [[buffer(6)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  HeadNormedRows xs{g, head_ss, p.x_stride, p.ss_stride, p.eps};
  qmv_rows_body<Fmt, M, R>(QuantWeights<Fmt>{w, scales, biases}, xs, y, p.y_stride, p.in_dim, p.out_dim, 0,
                           min(p.rows, (uint)M), tg, sg, lane);
}
