#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"
// The walk and the formats of quant.h; silu of norm.h.
#include "quant.h"
#include "norm.h"

// Norm-fused matvecs of decode and verify steps (params/quant.h, QmvNormParams): the RMSNorm
// in front of a group of projections is folded into them. Every threadgroup reads the whole
// input row anyway, so each SIMD-group forms sum(h^2) in the same pass and, since the norm is
// one factor per row, y = rsqrt(mean(h^2) + eps) * W (h * norm_w): no norm dispatch, no
// barrier in between.
//   qmv_norm[_rows|_deep] one dispatch over the output rows of up to MQ_QMV_GROUP_MAX
//                         projections reading the same input (separate weights per member)
//   qmv_norm_silu[...]    gate and up together: out = silu(gate) * up in the epilogue
// h = x (+ mix when MQ_QMV_ADD_MIX: the residual add); threadgroup 0's first SIMD-group also
// writes h (x_out, never x: every threadgroup reads x) and the normalized rows xn.
// *_rows take 1..MQ_QMV_SMALL_ROWS rows, *_deep 1..MQ_QMV_MAX_ROWS, with one weight stream; a
// verify row is bit-identical to the one-row kernel's result (same walk, same order).

// Activation rows h = x (+ mix), handed to the walk as h * norm_w; ss[r] accumulates sum(h^2)
// of row r over the blocks this lane loads.
template <int M>
struct NormedRows {
  device const float* x;
  device const float* mix;
  device const uchar* norm_w;  // [in_dim] bf16, or f32 with MQ_QMV_NORM_F32
  uint stride;
  uint flags;
  float ss[M];

  // Elements 4i .. 4i+3 of the norm weight.
  float4 weight4(uint i) const {
    if (flags & MQ_QMV_NORM_F32) return ((device const float4*)norm_w)[i];
    device const bfloat* wb = (device const bfloat*)norm_w + 4 * i;
    return float4(float(wb[0]), float(wb[1]), float(wb[2]), float(wb[3]));
  }
  // float4 i of row r's h.
  float4 h4(uint r, uint i) const {
    float4 h = ((device const float4*)(x + (ulong)r * stride))[i];
    if (flags & MQ_QMV_ADD_MIX) h += ((device const float4*)(mix + (ulong)r * stride))[i];
    return h;
  }
  float load(uint r, uint blk, thread float4* xv) {
    float4 sum = 0.0f, sq = 0.0f;
    for (uint i = 0; i < QBLOCK / 4; i++) {
      const uint e = blk * QBLOCK / 4 + i;
      const float4 h = h4(r, e);
      sq = fma(h, h, sq);
      xv[i] = h * weight4(e);
      sum += xv[i];
    }
    ss[r] += (sq.x + sq.y) + (sq.z + sq.w);
    return (sum.x + sum.y) + (sum.z + sum.w);
  }
};

// inv[r] = rsqrt(mean(h_r^2) + eps) for r < nrows, from every lane's partial sums.
template <int M>
inline void normed_rows_inv(thread const NormedRows<M>& xs, uint nrows, uint in_dim, float eps, thread float* inv) {
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    inv[r] = rsqrt(simd_sum(xs.ss[r]) / (float)in_dim + eps);
  }
}

// One SIMD-group writes h (with MQ_QMV_WRITE_H) and xn = h * inv * norm_w (with
// MQ_QMV_WRITE_XN) for every row, the way rms_norm_residual leaves x and xn.
template <int M>
inline void normed_rows_write(thread const NormedRows<M>& xs, thread const float* inv, uint nrows, uint in_dim,
                              device float* x_out, device float* xn, uint lane) {
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    device float4* h_dst = (device float4*)(x_out + (ulong)r * xs.stride);
    device float4* n_dst = (device float4*)(xn + (ulong)r * xs.stride);
    for (uint i = lane; i < in_dim / 4; i += 32) {
      const float4 h = xs.h4(r, i);
      if (xs.flags & MQ_QMV_WRITE_H) h_dst[i] = h;
      if (xs.flags & MQ_QMV_WRITE_XN) n_dst[i] = h * inv[r] * xs.weight4(i);
    }
  }
}

// ---------------------------------------------------------------------------------------
// y_m[r] = W_m (rms(h[r]) * norm_w) for the members m < p.members of a group. Threadgroups
// [tg_end[m-1], tg_end[m]) (tg_end[-1] = 0) serve member m, MQ_QMV_SIMDGROUPS * R of its rows
// each, exactly as qmv's threadgroups would. M: 1 (qmv_norm), MQ_QMV_SMALL_ROWS (_rows) or
// MQ_QMV_MAX_ROWS (_deep); R: rows per SIMD-group, one variant for the whole group (params/quant.h).
template <typename Fmt, int M, int R>
[[kernel]] void qmv_norm(
    device const uint* w0 [[buffer(0)]],  // member m: [out_dim[m]][in_dim / 32 * WORDS]
    device const uint* w1 [[buffer(1)]],  //   (members past p.members: bind anything)
    device const uint* w2 [[buffer(2)]],
    device const uint* w3 [[buffer(3)]],
    device const typename Fmt::scale_t* s0 [[buffer(4)]],  // member m: [out_dim[m]][in_dim/GROUP]
    device const typename Fmt::scale_t* s1 [[buffer(5)]],
    device const typename Fmt::scale_t* s2 [[buffer(6)]],
    device const typename Fmt::scale_t* s3 [[buffer(7)]],
    device const typename Fmt::scale_t* b0 [[buffer(8)]],  // member m: [out_dim[m]][in_dim/GROUP]
    device const typename Fmt::scale_t* b1 [[buffer(9)]],
    device const typename Fmt::scale_t* b2 [[buffer(10)]],
    device const typename Fmt::scale_t* b3 [[buffer(11)]],
    device const float* x [[buffer(12)]],       // [rows][x_stride]: the residual stream
    device const float* mix [[buffer(13)]],     // [rows][x_stride]: added with MQ_QMV_ADD_MIX
    device const uchar* norm_w [[buffer(14)]],  // [in_dim] bf16, or f32 with MQ_QMV_NORM_F32
    device float* x_out [[buffer(15)]],         // [rows][x_stride]: h (MQ_QMV_WRITE_H); not x
    device float* xn [[buffer(16)]],            // [rows][x_stride]: rms(h) * norm_w (MQ_QMV_WRITE_XN)
    device float* y0 [[buffer(17)]],            // member m: [rows][y_stride[m]], first out_dim[m] written
    device float* y1 [[buffer(18)]],
    device float* y2 [[buffer(19)]],
    device float* y3 [[buffer(20)]],
    constant QmvNormParams& p [[buffer(21)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  uint m = 0;
  while (m + 1 < p.members && tg >= p.tg_end[m]) m++;
  const QuantWeights<Fmt> wm{m == 0 ? w0 : m == 1 ? w1 : m == 2 ? w2 : w3, m == 0 ? s0 : m == 1 ? s1 : m == 2 ? s2 : s3,
                             m == 0 ? b0 : m == 1 ? b1 : m == 2 ? b2 : b3};
  device float* y = m == 0 ? y0 : m == 1 ? y1 : m == 2 ? y2 : y3;
  const uint out_dim = p.out_dim[m], y_stride = p.y_stride[m];
  const uint row0 = qmv_first_row(tg - (m == 0 ? 0 : p.tg_end[m - 1]), sg, R);
  if (row0 >= out_dim) return;  // uniform over the SIMD-group (never threadgroup 0's first)
  const uint nrows = min(p.rows, (uint)M);
  ulong rows[R];
  qmv_clamped_rows<R>(0, row0, out_dim, rows);
  float acc[M * R];
  for (int i = 0; i < M * R; i++) acc[i] = 0.0f;
  NormedRows<M> xs{x, mix, norm_w, p.x_stride, p.flags};
  for (int r = 0; r < M; r++) xs.ss[r] = 0.0f;
  qmv_walk<Fmt, M, R, R>(wm, wm, rows, p.in_dim / QBLOCK, nrows, lane, xs, acc);
  float inv[M];
  normed_rows_inv<M>(xs, nrows, p.in_dim, p.eps, inv);
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    for (int i = 0; i < R; i++) {
      const float sum = simd_sum(acc[r * R + i]);
      if (lane == 0 && row0 + i < out_dim) y[(ulong)r * y_stride + row0 + i] = sum * inv[r];
    }
  }
  if (tg == 0 && sg == 0) normed_rows_write<M>(xs, inv, nrows, p.in_dim, x_out, xn, lane);
}

// ---------------------------------------------------------------------------------------
// out[r][j] = silu(gate_j . u_r) * (up_j . u_r), u_r = rms(h[r]) * norm_w: the MLP's gate and
// up projections (one format) with the activation in the epilogue. Each SIMD-group walks R / 2
// rows of gate and the same rows of up (one weight stream of R rows, as qmv's R variant);
// dispatch ceil(out_dim[0] / (MQ_QMV_SIMDGROUPS * R / 2)) threadgroups. p.members is 1;
// out_dim[0], y_stride[0] are out's.
template <typename Fmt, int M, int R>
[[kernel]] void qmv_norm_silu(
    device const uint* gate_w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* gate_s [[buffer(1)]],       // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* gate_b [[buffer(2)]],       // [out_dim][in_dim/GROUP]
    device const uint* up_w [[buffer(3)]],                           // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* up_s [[buffer(4)]],         // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* up_b [[buffer(5)]],         // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(6)]],        // [rows][x_stride]: the residual stream
    device const float* mix [[buffer(7)]],      // [rows][x_stride]: added with MQ_QMV_ADD_MIX
    device const uchar* norm_w [[buffer(8)]],   // [in_dim] bf16, or f32 with MQ_QMV_NORM_F32
    device float* x_out [[buffer(9)]],          // [rows][x_stride]: h (MQ_QMV_WRITE_H); not x
    device float* xn [[buffer(10)]],            // [rows][x_stride]: rms(h) * norm_w (MQ_QMV_WRITE_XN)
    device float* out [[buffer(11)]],           // [rows][y_stride[0]], first out_dim[0] written
    constant QmvNormParams& p [[buffer(12)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int HALF = R / 2;
  const uint out_dim = p.out_dim[0];
  const uint row0 = qmv_first_row(tg, sg, HALF);
  if (row0 >= out_dim) return;  // uniform over the SIMD-group (never threadgroup 0's first)
  const uint nrows = min(p.rows, (uint)M);
  ulong rows[R];
  qmv_clamped_rows<HALF>(0, row0, out_dim, rows);
  qmv_clamped_rows<HALF>(0, row0, out_dim, rows + HALF);
  float acc[M * R];
  for (int i = 0; i < M * R; i++) acc[i] = 0.0f;
  NormedRows<M> xs{x, mix, norm_w, p.x_stride, p.flags};
  for (int r = 0; r < M; r++) xs.ss[r] = 0.0f;
  const QuantWeights<Fmt> gate{gate_w, gate_s, gate_b}, up{up_w, up_s, up_b};
  qmv_walk<Fmt, M, R, HALF>(gate, up, rows, p.in_dim / QBLOCK, nrows, lane, xs, acc);
  float inv[M];
  normed_rows_inv<M>(xs, nrows, p.in_dim, p.eps, inv);
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    for (int i = 0; i < HALF; i++) {
      const float g = simd_sum(acc[r * R + i]) * inv[r], u = simd_sum(acc[r * R + HALF + i]) * inv[r];
      if (lane == 0 && row0 + i < out_dim) out[(ulong)r * p.y_stride[0] + row0 + i] = mq_norm::silu(g) * u;
    }
  }
  if (tg == 0 && sg == 0) normed_rows_write<M>(xs, inv, nrows, p.in_dim, x_out, xn, lane);
}
