// The Qwen3-VL vision tower of Qwen3.5 (docs/images.md): biased linears with their epilogues,
// LayerNorm, the learned position grid, the 2-D rotary embedding and full attention within one
// image. Activations f32 (bf16 ones put the language model's logits percents off); weights
// bf16/f16/f32 read as stored, vectors bf16 or f32 (F16 vectors are widened at load).
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "norm.h"
#include "params.h"

namespace mq_vision {

enum Act : int { kNone = 0, kGeluTanh = 1, kGeluErf = 2 };

// erf within about 1 ulp: njuffa's faithfully rounded erff (the approximation MLX's Metal
// backend uses); MSL has no erf.
inline float erf_f32(float a) {
  const float t = abs(a), s = a * a;
  float r;
  if (t > 0.927734375f) {
    r = fma(-1.72853470e-5f, t, 3.83197126e-4f);
    const float u = fma(-3.88396438e-3f, t, 2.42546219e-2f);
    r = fma(r, s, u);
    r = fma(r, t, -1.06777877e-1f);
    r = fma(r, t, -6.34846687e-1f);
    r = fma(r, t, -1.28717512e-1f);
    r = fma(r, t, -t);
    r = copysign(1.0f - precise::exp(r), a);
  } else {
    r = -5.96761703e-4f;
    r = fma(r, s, 4.99119423e-3f);
    r = fma(r, s, -2.67681349e-2f);
    r = fma(r, s, 1.12819925e-1f);
    r = fma(r, s, -3.76125336e-1f);
    r = fma(r, s, 1.28379166e-1f);
    r = fma(r, a, a);
  }
  return r;
}

// The blocks' MLP: GELU with tanh (mlx nn.GELU(approx="tanh")); the merger: exact GELU.
template <int ACT>
inline float activate(float v) {
  if (ACT == kGeluTanh) return 0.5f * v * (1.0f + precise::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  if (ACT == kGeluErf) return 0.5f * v * (1.0f + erf_f32(v * 0.7071067811865476f));
  return v;
}

}  // namespace mq_vision

// y [rows][y_stride] = act(x W^T + b) (RESIDUAL: y += x W^T + b), VisionLinearParams.
//   x: [rows][x_stride] f32; w: [out][in] W (bfloat, half or float); b: [out] B (bfloat or float).
// Grid (ceil(out / TILE), ceil(rows / TILE)), exactly MQ_VISION_LINEAR_THREADS threads: thread t
// owns output column t % TILE of the tile for TILE / (THREADS / TILE) consecutive rows; per output
// the products are summed in increasing k, then b is added, then the activation.
template <typename W, typename B, int ACT, bool RESIDUAL>
[[kernel]] void vision_linear(device const float* x [[buffer(0)]],
                              device const W* w [[buffer(1)]],
                              device const B* b [[buffer(2)]],
                              device float* y [[buffer(3)]],
                              constant VisionLinearParams& p [[buffer(4)]],
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]]) {
  constexpr uint T = MQ_VISION_TILE, N = MQ_VISION_LINEAR_THREADS, PER = T * T / N;
  threadgroup float xs[T][T + 1];
  threadgroup float ws[T][T + 1];
  const uint col = tid % T, first = (tid / T) * PER;
  const uint o0 = tg.x * T, r0 = tg.y * T;
  float acc[PER];
  for (uint j = 0; j < PER; ++j) acc[j] = 0.0f;
  for (uint k0 = 0; k0 < p.in; k0 += T) {
    for (uint e = tid; e < T * T; e += N) {
      const uint i = e / T, k = e % T;
      const bool in_k = k0 + k < p.in;
      xs[i][k] = (r0 + i < p.rows && in_k) ? x[ulong(r0 + i) * p.x_stride + k0 + k] : 0.0f;
      ws[i][k] = (o0 + i < p.out && in_k) ? float(w[ulong(o0 + i) * p.in + k0 + k]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint k = 0; k < T; ++k) {
      const float wv = ws[col][k];
      for (uint j = 0; j < PER; ++j) acc[j] = fma(xs[first + j][k], wv, acc[j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const uint o = o0 + col;
  if (o >= p.out) return;
  const float bias = float(b[o]);
  for (uint j = 0; j < PER; ++j) {
    const uint r = r0 + first + j;
    if (r >= p.rows) break;
    device float* yo = y + ulong(r) * p.y_stride + o;
    const float v = mq_vision::activate<ACT>(acc[j] + bias);
    *yo = RESIDUAL ? *yo + v : v;
  }
}

// The bias and epilogue of a quantized linear, whose product t = x W^T the projections' qmm
// wrote (VisionBiasParams): y = act(t + b), or y += t + b (RESIDUAL); t may be y itself when
// not RESIDUAL. t, y f32 [rows][stride]; b [out] B (bfloat or float). Grid of threads (out, rows).
template <typename B, int ACT, bool RESIDUAL>
[[kernel]] void vision_bias(device const float* t [[buffer(0)]],
                            device const B* b [[buffer(1)]],
                            device float* y [[buffer(2)]],
                            constant VisionBiasParams& p [[buffer(3)]],
                            uint2 gid [[thread_position_in_grid]]) {
  const uint o = gid.x, r = gid.y;
  if (o >= p.out || r >= p.rows) return;
  const float v = t[ulong(r) * p.t_stride + o] + float(b[o]);
  device float* yo = y + ulong(r) * p.y_stride + o;
  *yo = RESIDUAL ? *yo + v : mq_vision::activate<ACT>(v);
}

// y = (x - mean) * rsqrt(var + eps) * w + b per row (VisionNormParams); x, y [rows][stride] f32
// (y may not alias x), w, b [dim] B. Grid: one threadgroup per row, threads a multiple of 32.
template <typename B>
[[kernel]] void vision_layer_norm(device const float* x [[buffer(0)]],
                                  device const B* w [[buffer(1)]],
                                  device const B* b [[buffer(2)]],
                                  device float* y [[buffer(3)]],
                                  constant VisionNormParams& p [[buffer(4)]],
                                  uint row [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint tpg [[threads_per_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint n_sg [[simdgroups_per_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[MQ_SIMD_WIDTH];
  device const float* xr = x + ulong(row) * p.x_stride;
  device float* yr = y + ulong(row) * p.y_stride;
  float s = 0.0f;
  for (uint i = tid; i < p.dim; i += tpg) s += xr[i];
  const float mean = mq_norm::threadgroup_sum(s, partial, sg, n_sg, lane) / float(p.dim);
  threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD-group has read `partial` before it is reused
  float ss = 0.0f;
  for (uint i = tid; i < p.dim; i += tpg) {
    const float d = xr[i] - mean;
    ss += d * d;
  }
  const float inv = rsqrt(mq_norm::threadgroup_sum(ss, partial, sg, n_sg, lane) / float(p.dim) + p.eps);
  for (uint i = tid; i < p.dim; i += tpg) yr[i] = (xr[i] - mean) * inv * float(w[i]) + float(b[i]);
}

// x [rows][hidden] = Σ_c weight[r][c] · table[index[r][c]] (c = 0..3 in order), table
// [num_position_embeddings][hidden] T (bfloat, half or float), index uint4 [rows], weight float4
// [rows] (VisionPosEmbedParams). Grid of threads (hidden, rows).
template <typename T>
[[kernel]] void vision_pos_embed(device const T* table [[buffer(0)]],
                                 device const uint4* index [[buffer(1)]],
                                 device const float4* weight [[buffer(2)]],
                                 device float* x [[buffer(3)]],
                                 constant VisionPosEmbedParams& p [[buffer(4)]],
                                 uint2 gid [[thread_position_in_grid]]) {
  const uint i = gid.x, r = gid.y;
  if (i >= p.hidden || r >= p.rows) return;
  const uint4 id = index[r];
  const float4 wt = weight[r];
  const ulong h = p.hidden;
  float v = wt.x * float(table[id.x * h + i]);
  v += wt.y * float(table[id.y * h + i]);
  v += wt.z * float(table[id.z * h + i]);
  v += wt.w * float(table[id.w * h + i]);
  x[ulong(r) * h + i] = v;
}

// The 2-D rotary embedding in place on qkv's q and k (VisionRopeParams): pair (i, i + head_dim/2)
// turns by angle = pos · inv_freq[i % (head_dim/4)], pos = positions[r].x (patch row) for
// i < head_dim/4, else .y (patch column); x1' = x1 cos − x2 sin, x2' = x2 cos + x1 sin.
// inv_freq: float [head_dim / 4]. Grid of threads (head_dim / 2, heads, rows).
[[kernel]] void vision_rope(device float* qkv [[buffer(0)]],
                            device const uint2* positions [[buffer(1)]],
                            device const float* inv_freq [[buffer(2)]],
                            constant VisionRopeParams& p [[buffer(3)]],
                            uint3 gid [[thread_position_in_grid]]) {
  const uint i = gid.x, h = gid.y, r = gid.z, half_dim = p.head_dim / 2, quarter = p.head_dim / 4;
  if (i >= half_dim || h >= p.heads || r >= p.rows) return;
  const uint2 rc = positions[r];
  const float angle = float(i < quarter ? rc.x : rc.y) * inv_freq[i % quarter];
  const float c = precise::cos(angle), s = precise::sin(angle);
  for (uint part = 0; part < 2; ++part) {  // q, then k
    device float* v = qkv + ulong(r) * p.qkv_stride + (part * p.heads + h) * p.head_dim;
    const float x1 = v[i], x2 = v[i + half_dim];
    v[i] = x1 * c - x2 * s;
    v[i + half_dim] = x2 * c + x1 * s;
  }
}

// out[r][h] = softmax_j(q_r · k_j · scale) v_j over every row j of the image (no mask), per head
// (VisionAttentionParams). One SIMD-group per (row, head); lane holds dims lane + 32 m of q and of
// its accumulator; keys in increasing order with an online softmax (one simd_sum per key).
// Grid (ceil(rows / simdgroups), heads); no threadgroup memory, no barrier.
[[kernel]] void vision_attention(device const float* qkv [[buffer(0)]],
                                 device float* out [[buffer(1)]],
                                 constant VisionAttentionParams& p [[buffer(2)]],
                                 uint2 tg [[threadgroup_position_in_grid]],
                                 uint sg [[simdgroup_index_in_threadgroup]],
                                 uint n_sg [[simdgroups_per_threadgroup]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint J = MQ_VISION_MAX_HEAD_DIM / MQ_SIMD_WIDTH;
  const uint row = tg.x * n_sg + sg, h = tg.y;
  if (row >= p.rows) return;
  const uint k_off = p.heads * p.head_dim + h * p.head_dim, v_off = 2 * p.heads * p.head_dim + h * p.head_dim;
  float q[J], acc[J];
  device const float* qr = qkv + ulong(row) * p.qkv_stride + h * p.head_dim;
  for (uint j = 0; j < J; ++j) {
    const uint d = lane + MQ_SIMD_WIDTH * j;
    q[j] = d < p.head_dim ? qr[d] * p.scale : 0.0f;
  }
  for (uint j = 0; j < J; ++j) acc[j] = 0.0f;
  float m = 0.0f, l = 0.0f;
  for (uint key = 0; key < p.rows; ++key) {
    device const float* kr = qkv + ulong(key) * p.qkv_stride;
    float partial = 0.0f;
    for (uint j = 0; j < J; ++j) {
      const uint d = lane + MQ_SIMD_WIDTH * j;
      if (d < p.head_dim) partial = fma(q[j], kr[k_off + d], partial);
    }
    const float s = simd_sum(partial);
    // The first key sets the running maximum (no infinities under fast math).
    const float m_new = key == 0 ? s : max(m, s);
    const float carry = key == 0 ? 0.0f : exp(m - m_new), e = exp(s - m_new);
    l = l * carry + e;
    for (uint j = 0; j < J; ++j) {
      const uint d = lane + MQ_SIMD_WIDTH * j;
      acc[j] = acc[j] * carry + (d < p.head_dim ? e * kr[v_off + d] : 0.0f);
    }
    m = m_new;
  }
  device float* o = out + ulong(row) * p.out_stride + h * p.head_dim;
  for (uint j = 0; j < J; ++j) {
    const uint d = lane + MQ_SIMD_WIDTH * j;
    if (d < p.head_dim) o[d] = acc[j] / l;
  }
}
