// RMSNorm over rows (optionally fused with the residual add before it), the MLP
// activation silu(gate) * up, and the residual add. All activations f32.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

namespace mq_norm {

// Sum of v over the threadgroup, returned to every thread. Reduction order: each
// SIMD-group sums its lanes (simd_sum), then one SIMD-group sums the per-group partials
// in index order; fixed for a given threadgroup size. `partial` holds >= 32 floats.
inline float threadgroup_sum(float v, threadgroup float* partial, uint sg, uint n_sg, uint lane) {
  v = simd_sum(v);
  if (lane == 0) partial[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = lane < n_sg ? partial[lane] : 0.0f;
  total = simd_sum(total);
  return total;
}

// silu(g) = g * sigmoid(g). The exponent is clamped so no infinity arises under fast
// math; beyond it silu(g) is below 1e-36 in magnitude either way.
inline float silu(float g) { return g / (1.0f + exp(min(-g, 88.0f))); }

// One row: y = x * rsqrt(mean(x^2) + eps) * w, after x += r when RESIDUAL.
template <bool RESIDUAL, typename W>
inline void rms_norm_row(device float* xr, device const float* rr, device const W* w, device float* yr,
                         constant RmsNormParams& p, threadgroup float* partial, uint tid, uint tpg, uint sg,
                         uint n_sg, uint lane) {
  float ss = 0.0f;
  for (uint i = tid; i < p.dim; i += tpg) {
    float v = xr[i];
    if (RESIDUAL) {
      v += rr[i];
      xr[i] = v;  // re-read below by this same thread
    }
    ss += v * v;
  }
  const float total = threadgroup_sum(ss, partial, sg, n_sg, lane);
  const float inv = rsqrt(total / (float)p.dim + p.eps);
  for (uint i = tid; i < p.dim; i += tpg) {
    yr[i] = xr[i] * inv * (float)w[i];
  }
}

}  // namespace mq_norm

// y[row] = x[row] * rsqrt(mean(x[row]^2) + eps) * w.
//   x: [rows][x_stride] f32, w: [dim] norm weight multiplied as stored (W: bfloat, or
//   float for checkpoints whose norms are f32/f16: host names *_wf32), y: [rows][y_stride]
//   f32 (may alias x).
// Grid: one threadgroup per row (threadgroup_position.x = row); threads a multiple of 32.
template <typename W>
[[kernel]] void rms_norm(device float* x [[buffer(0)]],
                         device const W* w [[buffer(1)]],
                         device float* y [[buffer(2)]],
                         constant RmsNormParams& p [[buffer(3)]],
                         uint row [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint tpg [[threads_per_threadgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint n_sg [[simdgroups_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[32];
  mq_norm::rms_norm_row<false, W>(x + (ulong)row * p.x_stride, x, w, y + (ulong)row * p.y_stride, p, partial, tid,
                                  tpg, sg, n_sg, lane);
}

// x[row] += r[row] (the residual stream, written back), then
// y[row] = x[row] * rsqrt(mean(x[row]^2) + eps) * w: the residual add fused into the
// norm that always follows it.
//   x: [rows][x_stride] f32 read-write, r: [rows][r_stride] f32, w: [dim] W (as rms_norm),
//   y: [rows][y_stride] f32 (must not alias x or r).
// Grid: one threadgroup per row; threads a multiple of 32.
template <typename W>
[[kernel]] void rms_norm_residual(device float* x [[buffer(0)]],
                                  device const float* r [[buffer(1)]],
                                  device const W* w [[buffer(2)]],
                                  device float* y [[buffer(3)]],
                                  constant RmsNormParams& p [[buffer(4)]],
                                  uint row [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint tpg [[threads_per_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint n_sg [[simdgroups_per_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[32];
  mq_norm::rms_norm_row<true, W>(x + (ulong)row * p.x_stride, r + (ulong)row * p.r_stride, w,
                                 y + (ulong)row * p.y_stride, p, partial, tid, tpg, sg, n_sg, lane);
}



// out[row][i] = silu(gate[row][i]) * up[row][i] (MLP activation).
//   gate: [rows][gate_stride] f32, up: [rows][up_stride] f32 (may be the same buffer as
//   gate, bound at an offset: the fused [gate | up] projection), out: [rows][out_stride] f32
//   (may alias gate).
// Grid: threads (ceil(n / 4), rows); thread x moves elements 4x .. 4x+3.
[[kernel]] void silu_mul(device const float* gate [[buffer(0)]],
                         device const float* up [[buffer(1)]],
                         device float* out [[buffer(2)]],
                         constant SiluMulParams& p [[buffer(3)]],
                         uint2 gid [[thread_position_in_grid]]) {
  const uint i = gid.x * 4;
  if (i >= p.n || gid.y >= p.rows) return;
  const float4 g = *(device const float4*)(gate + (ulong)gid.y * p.gate_stride + i);
  const float4 u = *(device const float4*)(up + (ulong)gid.y * p.up_stride + i);
  const float4 a = float4(mq_norm::silu(g.x), mq_norm::silu(g.y), mq_norm::silu(g.z), mq_norm::silu(g.w));
  *(device float4*)(out + (ulong)gid.y * p.out_stride + i) = a * u;
}

// x[i] += r[i], i < n (residual add).
//   x: [n] f32 read-write, r: [n] f32.
// Grid: threads ceil(n / 4); thread t moves elements 4t .. 4t+3.
[[kernel]] void residual_add(device float* x [[buffer(0)]],
                             device const float* r [[buffer(1)]],
                             constant ResidualAddParams& p [[buffer(2)]],
                             uint t [[thread_position_in_grid]]) {
  const uint i = t * 4;
  if (i + 4 <= p.n) {
    *(device float4*)(x + i) += *(device const float4*)(r + i);
  } else {
    for (uint j = i; j < p.n; j++) x[j] += r[j];
  }
}
