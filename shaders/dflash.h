// The DFlash drafter's attention-side kernels (issue 28; math in csrc/engine/dflash.h): the
// capture of the target's hidden states, the q/k norm + RoPE + context cache append, and the
// block's attention over context and block. Sizes: params/dflash.h.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

// The residual stream after a target layer into its columns of the capture rows.
// Grid of threads (dim, rows); any threadgroup shape.
[[kernel]] void dflash_capture(device const float* x [[buffer(0)]],
                               device const float* mix [[buffer(1)]],
                               device float* out [[buffer(2)]],
                               constant DflashCaptureParams& p [[buffer(3)]],
                               uint2 gid [[thread_position_in_grid]]) {
  if (gid.x >= p.dim || gid.y >= p.rows) return;
  const ulong i = ulong(gid.y) * p.dim + gid.x;
  out[ulong(gid.y) * p.out_stride + p.col0 + gid.x] = x[i] + mix[i];
}

// Per (head, row): RMSNorm over the head with its weight, then split-half RoPE at the row's
// position; q heads in place, k heads into the slot's cache row (v copied beside). One SIMD-group.
template <typename W>
[[kernel]] void dflash_qk_norm_rope(device float* q [[buffer(0)]],
                                    device const float* k [[buffer(1)]],
                                    device const float* v [[buffer(2)]],
                                    device const W* q_norm [[buffer(3)]],
                                    device const W* k_norm [[buffer(4)]],
                                    device float* k_cache [[buffer(5)]],
                                    device float* v_cache [[buffer(6)]],
                                    constant StepSegments& segs [[buffer(7)]],
                                    constant DflashPrepParams& p [[buffer(8)]],
                                    uint2 tg [[threadgroup_position_in_grid]],
                                    uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint J = MQ_DFLASH_MAX_HEAD_DIM / MQ_SIMD_WIDTH;
  const uint u = tg.x, r = tg.y, hd = p.head_dim, n = hd / MQ_SIMD_WIDTH, half_j = n / 2;
  uint s = 0;
  while (s + 1 < segs.count && r >= segs.seg[s + 1].first_row) ++s;
  const uint slot = segs.seg[s].slot, pos = segs.seg[s].position + (r - segs.seg[s].first_row);
  const bool is_q = u < p.nq;
  const uint h = is_q ? u : u - p.nq;
  const ulong cache_row = ulong(slot) * p.slot_floats + ulong(pos) * (p.nkv * hd) + h * hd;
  device const float* src = is_q ? q + ulong(r) * p.q_stride + h * hd : k + ulong(r) * p.kv_stride + h * hd;
  device const W* w = is_q ? q_norm : k_norm;
  float x[J];
  float ss = 0.0f;
  for (uint j = 0; j < n; ++j) {
    x[j] = src[lane + MQ_SIMD_WIDTH * j];
    ss += x[j] * x[j];
  }
  const float inv = rsqrt(simd_sum(ss) / float(hd) + p.eps);
  for (uint j = 0; j < n; ++j) x[j] = x[j] * inv * float(w[lane + MQ_SIMD_WIDTH * j]);
  for (uint j = 0; j < half_j; ++j) {
    const uint i = lane + MQ_SIMD_WIDTH * j;
    const float angle = float(pos) * exp2(-float(2 * i) / float(hd) * p.log2_theta);
    const float c = precise::cos(angle), sn = precise::sin(angle);
    const float x1 = x[j], x2 = x[j + half_j];
    x[j] = x1 * c - x2 * sn;
    x[j + half_j] = x2 * c + x1 * sn;
  }
  device float* dst = is_q ? q + ulong(r) * p.q_stride + h * hd : k_cache + cache_row;
  for (uint j = 0; j < n; ++j) dst[lane + MQ_SIMD_WIDTH * j] = x[j];
  if (!is_q) {
    device const float* vr = v + ulong(r) * p.kv_stride + h * hd;
    for (uint j = 0; j < n; ++j) v_cache[cache_row + lane + MQ_SIMD_WIDTH * j] = vr[lane + MQ_SIMD_WIDTH * j];
  }
}

// Per (query head, row): softmax attention over keys 0 .. n_keys - 1 of one slot's cache, no
// mask, keys in increasing order with an online softmax (one simd_sum per key). One SIMD-group.
[[kernel]] void dflash_attention(device const float* q [[buffer(0)]],
                                 device const float* k_cache [[buffer(1)]],
                                 device const float* v_cache [[buffer(2)]],
                                 device float* out [[buffer(3)]],
                                 constant DflashAttentionParams& p [[buffer(4)]],
                                 uint2 tg [[threadgroup_position_in_grid]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint J = MQ_DFLASH_MAX_HEAD_DIM / MQ_SIMD_WIDTH;
  const uint h = tg.x, r = tg.y, hd = p.head_dim, n = hd / MQ_SIMD_WIDTH, row = p.nkv * hd;
  const uint kv = h / (p.nq / p.nkv);
  float qr[J], acc[J];
  for (uint j = 0; j < n; ++j) {
    qr[j] = q[ulong(r) * p.q_stride + h * hd + lane + MQ_SIMD_WIDTH * j] * p.scale;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (uint t = 0; t < p.n_keys; ++t) {
    device const float* kt = k_cache + ulong(t) * row + kv * hd;
    float d = 0.0f;
    for (uint j = 0; j < n; ++j) d += qr[j] * kt[lane + MQ_SIMD_WIDTH * j];
    const float score = simd_sum(d);
    const float m_new = max(m, score), corr = exp(m - m_new), e = exp(score - m_new);
    device const float* vt = v_cache + ulong(t) * row + kv * hd;
    for (uint j = 0; j < n; ++j) acc[j] = acc[j] * corr + e * vt[lane + MQ_SIMD_WIDTH * j];
    l = l * corr + e;
    m = m_new;
  }
  for (uint j = 0; j < n; ++j) out[ulong(r) * p.out_stride + h * hd + lane + MQ_SIMD_WIDTH * j] = acc[j] / l;
}
