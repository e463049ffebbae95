// Gated full attention: per-head q/k RMSNorm + partial RoPE fused with the KV-cache
// append (prefill chunks), flash-decode partials with that prep done in registers (decode
// and verify rows) + log-sum-exp combine, and flash prefill on 8x8 SIMD-group matrices.
// Buffer layouts: params/attention.h.
// Everything after the cache read is f32; q8 cache values (int8 code * f16 scale) and
// f16 cache values are exact in f32, so the only roundings are f32 arithmetic.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

namespace mq_attn {

constant constexpr uint HD = MQ_ATTN_HEAD_DIM;
constant constexpr uint ROT = MQ_ATTN_ROT_DIM;
constant constexpr uint QB = MQ_ATTN_Q8_BLOCK;
// A head in a SIMD-group: lane holds dims 4 lane + 128 c .. + 3 in x[c], c < NC.
constant constexpr uint NC = HD / 128;
static_assert(HD % 128 == 0, "lanes hold float4 chunks 128 apart");
static_assert(ROT >= 8 && ROT <= 128 && (ROT & (ROT - 1)) == 0,
              "RoPE pair (i, i + ROT/2) sits in chunk 0 on lanes l and l ^ (ROT/8)");
static_assert(QB == 32, "a q8 block is the float4s of 8 neighbouring lanes");

constexpr uint isqrt(uint n) {  // a loop, not recursion: MSL has no recursive functions
  uint r = 0;
  while ((r + 1) * (r + 1) <= n) r++;
  return r;
}
static_assert(isqrt(HD) * isqrt(HD) == HD, "the score scale 1/sqrt(HD) is taken as exact");

// Scores are kept in log2 units so the softmax uses exp2: s = q.k * log2(e) / sqrt(HD).
constant constexpr float SCORE_SCALE = 1.44269504088896341f / (float)isqrt(HD);
// Initial running maximum: finite, so exp2(m_old - m_new) never meets inf - inf.
constant constexpr float NO_SCORE = -3.402823466e38f;
// One turn of a RoPE phase, per unit of its top 32 bits (a signed fraction of 2^32).
constant constexpr float TURN_RADIANS = 6.28318530717958648f / 4294967296.0f;

// sigmoid with the exponent clamped so fast math never sees an infinity.
inline float sigmoid(float g) { return 1.0f / (1.0f + exp(min(-g, 88.0f))); }
inline float4 sigmoid(float4 g) { return 1.0f / (1.0f + exp(min(-g, float4(88.0f)))); }

// Four consecutive cache elements e..e+3 of position t as f32 (exact for both formats).
// q8: scale_off = byte offset of the f16 scale plane; e must not cross a q8 block.
template <bool Q8>
inline float4 kv_load4(device const char* cache, ulong scale_off, uint t, uint kv_dim, uint e) {
  const ulong idx = (ulong)t * kv_dim + e;
  if (Q8) {
    device const half* scales = (device const half*)(cache + scale_off);
    const float d = (float)scales[(ulong)t * (kv_dim / QB) + e / QB];
    return float4(*(device const char4*)(cache + idx)) * d;
  }
  return float4(*(device const half4*)((device const half*)cache + idx));
}

// One head of a projection row (HD floats at src) into the lane layout.
inline void head_load(thread float4* x, device const float* src, uint lane) {
  for (uint c = 0; c < NC; c++) x[c] = *(device const float4*)(src + 4 * lane + 128 * c);
}

// The rotary position component pair i takes (M-RoPE, params/attention.h): height when
// i % 3 == 1 and i < ends.x, width when i % 3 == 2 and i < ends.y, else time.
inline int mrope_component(int3 pos, uint i, uint2 ends) {
  if (i % 3 == 1 && i < ends.x) return pos.y;
  if (i % 3 == 2 && i < ends.y) return pos.z;
  return pos.x;
}

// Per-head RMSNorm (weights w [HD], multiplied as stored) and RoPE at rotary position pos =
// (time, height, width) on a head in the lane layout. Prefill's prep and decode both call
// this, so a key appended by either is the same f32 value. Pair i = 4 (lane % (ROT/8)) +
// component rotates by p * rope_turns[i] / 2^64 turns, p = mrope_component(pos, i, ends)
// (integer phase: exact at any position; negative p wraps as the angle does); the signed top
// word is the phase in [-1/2, 1/2) turn. Text rows have all three components equal.
template <typename W>
inline void head_norm_rope(thread float4* x, device const W* w, device const ulong* rope_turns, int3 pos, uint2 ends,
                           float eps, uint lane) {
  float ss = 0.0f;
  for (uint c = 0; c < NC; c++) ss += dot(x[c], x[c]);
  const float inv = rsqrt(simd_sum(ss) / (float)HD + eps);
  for (uint c = 0; c < NC; c++) {
    device const W* wc = w + 4 * lane + 128 * c;
    x[c] = x[c] * inv * float4((float)wc[0], (float)wc[1], (float)wc[2], (float)wc[3]);
  }
  const float4 partner = simd_shuffle_xor(x[0], ROT / 8);  // dims i + ROT/2 <-> i
  if (lane < ROT / 4) {
    const uint i0 = 4 * (lane % (ROT / 8));
    float4 cs;
    float4 sn;
    for (uint j = 0; j < 4; j++) {
      const ulong phase = (ulong)(long)mrope_component(pos, i0 + j, ends) * rope_turns[i0 + j];
      const float angle = (float)as_type<int>((uint)(phase >> 32)) * TURN_RADIANS;
      cs[j] = precise::cos(angle);
      sn[j] = precise::sin(angle);
    }
    // (a, b) -> (a c - b s, b c + a s) for a = dim i, b = dim i + ROT/2.
    x[0] = lane < ROT / 8 ? x[0] * cs - partner * sn : x[0] * cs + partner * sn;
  }
}

// Rounds a head (lane layout) to what the cache stores for it at row `pos`, head `kvh`, and
// writes it there when `store`: afterwards x holds exactly what kv_load4 would read back.
// q8: block b (8 lanes' float4s) stores d = f16(amax / 127) and codes quantised against
// that stored d, so dequantisation reproduces x to within d / 2. f16: x rounded to half.
template <bool Q8>
inline void kv_round_store(thread float4* x, device char* cache, uint max_ctx, uint kv_dim, uint pos, uint kvh,
                           bool store, uint lane) {
  for (uint c = 0; c < NC; c++) {
    const ulong idx = (ulong)pos * kv_dim + kvh * HD + 128 * c + 4 * lane;
    if (Q8) {
      const float4 a = fabs(x[c]);
      float amax = max(max(a.x, a.y), max(a.z, a.w));
      amax = max(amax, simd_shuffle_xor(amax, 1));
      amax = max(amax, simd_shuffle_xor(amax, 2));
      amax = max(amax, simd_shuffle_xor(amax, 4));
      // Precise divisions: d and the codes are the exact roundings under any GPU math mode.
      const half d = (half)precise::divide(amax, 127.0f);
      const float df = (float)d;
      float4 code = float4(0.0f);
      if (df > 0.0f) {
        for (uint j = 0; j < 4; j++) code[j] = clamp(rint(precise::divide(x[c][j], df)), -127.0f, 127.0f);
      }
      if (store) {
        *(device char4*)(cache + idx) = char4(code);
        device half* scales = (device half*)(cache + (ulong)max_ctx * kv_dim);
        if (lane % (QB / 4) == 0) scales[idx / QB] = d;
      }
      x[c] = code * df;
    } else {
      const half4 h = half4(x[c]);
      if (store) *(device half4*)((device half*)cache + idx) = h;
      x[c] = float4(h);
    }
  }
}

// Splits of segment i's context in a decode dispatch (params/attention.h): its own, never
// the other segments', so its rows compute the same alone or batched.
inline uint segment_splits(constant StepSegments& segs, constant AttnDecodeParams& p, uint i) {
  return (segs.seg[i].position + segs.seg[i].rows + p.split_len[i] - 1) / p.split_len[i];
}

}  // namespace mq_attn

// ---------------------------------------------------------------------------------------
// q/k RMSNorm + RoPE + KV append, one dispatch for a prefill chunk's rows.
//   q:          [rows][q_stride] f32, query halves normed + rotated in place (gates untouched)
//   k:          [rows][k_stride] f32, normed + rotated in place
//   v:          [rows][v_stride] f32
//   q_norm, k_norm: [HEAD_DIM] bf16 (or f32: _wf32), multiplied as stored
//   rope_turns: [ROT_DIM / 2] uint64 phase steps (params/attention.h)
//   kc, vc:     this layer's K and V caches (q8 or f16 layout), rows pos_base.. written
//   rope_pos:   int [rows][3] rotary positions (time, height, width) when p.has_rope_pos
// Grid: one SIMD-group per (row, slot), slot = q head | k head | v head, in the lane layout.
template <bool Q8, typename W>
[[kernel]] void attn_qk_norm_rope_append(device float* q [[buffer(0)]],
                                         device float* k [[buffer(1)]],
                                         device const float* v [[buffer(2)]],
                                         device const W* q_norm [[buffer(3)]],
                                         device const W* k_norm [[buffer(4)]],
                                         device const ulong* rope_turns [[buffer(5)]],
                                         device char* kc [[buffer(6)]],
                                         device char* vc [[buffer(7)]],
                                         constant AttnPrepParams& p [[buffer(8)]],
                                         device const int* rope_pos [[buffer(9)]],
                                         uint tg [[threadgroup_position_in_grid]],
                                         uint sg [[simdgroup_index_in_threadgroup]],
                                         uint n_sg [[simdgroups_per_threadgroup]],
                                         uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_attn;
  const uint slots = p.nq + 2 * p.nkv;
  const uint g = tg * n_sg + sg;
  if (g >= p.rows * slots) return;  // whole SIMD-groups only
  const uint row = g / slots;
  const uint slot = g % slots;
  const uint pos = p.pos_base + row;
  const uint kv_dim = p.nkv * HD;

  float4 x[NC];
  if (slot >= p.nq + p.nkv) {  // value head: appended as is
    const uint kvh = slot - p.nq - p.nkv;
    head_load(x, v + (ulong)row * p.v_stride + kvh * HD, lane);
    kv_round_store<Q8>(x, vc, p.max_ctx, kv_dim, pos, kvh, true, lane);
    return;
  }

  const bool is_q = slot < p.nq;
  device float* h = is_q ? q + (ulong)row * p.q_stride + slot * 2 * HD
                         : k + (ulong)row * p.k_stride + (slot - p.nq) * HD;
  head_load(x, h, lane);
  const int3 rp = p.has_rope_pos ? int3(rope_pos[3 * row], rope_pos[3 * row + 1], rope_pos[3 * row + 2])
                                 : int3((int)pos + p.rope_delta);
  head_norm_rope(x, is_q ? q_norm : k_norm, rope_turns, rp, uint2(p.mrope_h_end, p.mrope_w_end), p.eps, lane);
  for (uint c = 0; c < NC; c++) *(device float4*)(h + 4 * lane + 128 * c) = x[c];
  if (!is_q) kv_round_store<Q8>(x, kc, p.max_ctx, kv_dim, pos, slot - p.nq, true, lane);
}


// ---------------------------------------------------------------------------------------
// Flash-decode partials for R rows of one segment and one kv head over one split of the
// segment's context, with the step's q/k norm, RoPE and K/V append folded in
// (params/attention.h says who appends).
//   q:       [rows][q_stride] f32, raw projection: per head [query | gate]
//   k, v:    [rows][k_stride], [rows][v_stride] f32, raw projections of the step's rows
//   q_norm, k_norm: [HEAD_DIM] bf16 (or f32: _wf32); rope_turns: [ROT_DIM / 2] uint64
//   kc, vc:  this layer's caches [slots][cache]; per segment, its slot's positions
//            < position read, position .. + rows written
//   part_o:  [rows][nq][n_splits][HEAD_DIM] f32, part_ms: [rows][nq][n_splits] float2
//   out:     [rows][out_stride] f32, written instead of the partials when the segment has
//            one split (the combine's o / l is not bit-equal to o * (1 / l): a segment's
//            own split count decides, so a row's bits do not depend on the other segments)
//   segs:    the step's segments (params/common.h)
// Threadgroup (split, kv head x head block, segment's row group: grid z counts the row
// groups of segment 0, then of segment 1, ...); SIMD-group = one query head of the
// kv head's head block (all of them read the same K/V rows): n_sg SIMD-groups serve heads
// [b n_sg, (b + 1) n_sg) of the kv head's n_rep, in ceil(n_rep / n_sg) blocks b.
// Positions go in blocks of KEYS: all their K/V loads first, then one simd_sum per
// (position, row), then per row one online softmax update over the block's visible
// positions: m' = max(m, s_i), l' = l 2^(m - m') + sum_i 2^(s_i - m'),
// o' = o 2^(m - m') + sum_i 2^(s_i - m') v_i, in position order. Blocks start at the split's
// first position whatever R is, so a row's partials do not depend on its row group. A row
// with no visible position in its split writes m = NO_SCORE, l = 0.
template <bool Q8, uint R, typename W>
[[max_total_threads_per_threadgroup(MQ_ATTN_DECODE_THREADS)]]
[[kernel]] void attn_decode(device const float* q [[buffer(0)]],
                            device const float* k [[buffer(1)]],
                            device const float* v [[buffer(2)]],
                            device const W* q_norm [[buffer(3)]],
                            device const W* k_norm [[buffer(4)]],
                            device const ulong* rope_turns [[buffer(5)]],
                            device char* kc [[buffer(6)]],
                            device char* vc [[buffer(7)]],
                            device float* part_o [[buffer(8)]],
                            device float2* part_ms [[buffer(9)]],
                            device float* out [[buffer(10)]],
                            constant StepSegments& segs [[buffer(11)]],
                            constant AttnDecodeParams& p [[buffer(12)]],
                            uint3 tg [[threadgroup_position_in_grid]],
                            uint sg [[simdgroup_index_in_threadgroup]],
                            uint n_sg [[simdgroups_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_attn;
  constexpr uint KEYS = MQ_ATTN_DECODE_KEYS;
  const uint n_rep = p.nq / p.nkv;
  const uint head_blocks = (n_rep + n_sg - 1) / n_sg;
  const uint kvh = tg.y / head_blocks;
  const uint rep = tg.y % head_blocks * n_sg + sg;
  if (rep >= n_rep) return;  // whole SIMD-groups of the last head block
  const uint head = kvh * n_rep + rep;
  const uint split = tg.x;
  // Grid z -> (segment, its row group): at most MQ_MAX_SEGMENTS steps.
  uint segment = 0;
  uint group = tg.z;
  while (segment + 1 < segs.count && group >= (segs.seg[segment].rows + R - 1) / R) {
    group -= (segs.seg[segment].rows + R - 1) / R;
    segment++;
  }
  const uint n_splits = segment_splits(segs, p, segment);
  if (split >= n_splits) return;  // past this segment's context (the grid has the most splits)
  const uint first_row = segs.seg[segment].first_row;
  const uint pos_base = segs.seg[segment].position;
  const uint split_len = p.split_len[segment];
  const int delta = p.rope_delta[segment];  // decode rows are text: all components cache index + delta
  kc += (ulong)segs.seg[segment].slot * p.cache_slot_bytes;
  vc += (ulong)segs.seg[segment].slot * p.cache_slot_bytes;
  q += (ulong)first_row * p.q_stride;  // rows below are the segment's
  k += (ulong)first_row * p.k_stride;
  v += (ulong)first_row * p.v_stride;
  const uint r0 = group * R;
  const uint nr = min(R, segs.seg[segment].rows - r0);
  const uint kv_dim = p.nkv * HD;
  const ulong scale_off = (ulong)p.max_ctx * kv_dim;
  // Positions this split serves to these rows: [t0, t1).
  const uint t0 = split * split_len;
  const uint t1 = min(t0 + split_len, pos_base + r0 + nr);
  const uint e = kvh * HD + 4 * lane;
  // Appends the step's positions of this row group that fall in this split.
  const bool appender = tg.y % head_blocks == 0 && sg == 0;

  float4 qv[R][NC];
  float4 o[R][NC];
  float m[R];
  float l[R];
  for (uint r = 0; r < R; r++) {
    for (uint c = 0; c < NC; c++) qv[r][c] = o[r][c] = float4(0.0f);
    m[r] = NO_SCORE;
    l[r] = 0.0f;
    if (r < nr) {  // uniform across the SIMD-group (head_norm_rope reduces over it)
      head_load(qv[r], q + (ulong)(r0 + r) * p.q_stride + head * 2 * HD, lane);
      head_norm_rope(qv[r], q_norm, rope_turns, int3((int)(pos_base + r0 + r) + delta), uint2(0), p.eps, lane);
      for (uint c = 0; c < NC; c++) qv[r][c] *= SCORE_SCALE;
    }
  }

  for (uint tb = t0; tb < t1; tb += KEYS) {
    float4 kk[KEYS][NC];
    float4 vv[KEYS][NC];
    for (uint i = 0; i < KEYS; i++) {
      const uint t = tb + i;
      if (t >= t1) {  // past the block's last visible position: weight 0, value 0
        for (uint c = 0; c < NC; c++) kk[i][c] = vv[i][c] = float4(0.0f);
      } else if (t < pos_base) {
        for (uint c = 0; c < NC; c++) {
          kk[i][c] = kv_load4<Q8>(kc, scale_off, t, kv_dim, e + 128 * c);
          vv[i][c] = kv_load4<Q8>(vc, scale_off, t, kv_dim, e + 128 * c);
        }
      } else {  // this step's row j = t - pos_base: prepared here, rounded as the cache holds it
        const uint j = t - pos_base;
        const bool store = appender && j >= r0;
        head_load(kk[i], k + (ulong)j * p.k_stride + kvh * HD, lane);
        head_norm_rope(kk[i], k_norm, rope_turns, int3((int)t + delta), uint2(0), p.eps, lane);
        kv_round_store<Q8>(kk[i], kc, p.max_ctx, kv_dim, t, kvh, store, lane);
        head_load(vv[i], v + (ulong)j * p.v_stride + kvh * HD, lane);
        kv_round_store<Q8>(vv[i], vc, p.max_ctx, kv_dim, t, kvh, store, lane);
      }
    }
    for (uint r = 0; r < R; r++) {
      // Row r sees positions <= pos_base + r0 + r: the first `seen` of the block.
      const uint last = min(t1 - 1, pos_base + r0 + r);
      const uint seen = r < nr && last >= tb ? min(KEYS, last - tb + 1) : 0;
      if (seen == 0) continue;  // uniform across the SIMD-group
      float s[KEYS];
      for (uint i = 0; i < KEYS; i++) {
        float d = 0.0f;
        for (uint c = 0; c < NC; c++) d += dot(qv[r][c], kk[i][c]);
        s[i] = simd_sum(d);
      }
      float mn = m[r];
      for (uint i = 0; i < seen; i++) mn = max(mn, s[i]);
      const float f = exp2(m[r] - mn);
      float w[KEYS];
      for (uint i = 0; i < KEYS; i++) w[i] = i < seen ? exp2(s[i] - mn) : 0.0f;
      float lsum = l[r] * f;
      for (uint i = 0; i < KEYS; i++) lsum += w[i];
      l[r] = lsum;
      for (uint c = 0; c < NC; c++) {
        float4 acc = o[r][c] * f;
        for (uint i = 0; i < KEYS; i++) acc += w[i] * vv[i][c];
        o[r][c] = acc;
      }
      m[r] = mn;
    }
  }

  for (uint r = 0; r < R; r++) {
    if (r >= nr) break;
    const uint row = r0 + r;  // of the segment
    if (n_splits == 1) {
      const float inv = 1.0f / l[r];
      device const float* gate = q + (ulong)row * p.q_stride + head * 2 * HD + HD + 4 * lane;
      device float* dst = out + (ulong)(first_row + row) * p.out_stride + head * HD + 4 * lane;
      for (uint c = 0; c < NC; c++) {
        *(device float4*)(dst + 128 * c) = o[r][c] * inv * sigmoid(*(device const float4*)(gate + 128 * c));
      }
    } else {
      const ulong idx = ((ulong)(first_row + row) * p.nq + head) * p.n_splits + split;
      for (uint c = 0; c < NC; c++) *(device float4*)(part_o + idx * HD + 4 * lane + 128 * c) = o[r][c];
      if (lane == 0) part_ms[idx] = float2(m[r], l[r]);
    }
  }
}


// Merges the n_splits_i partials of one (head, row) of segment i by log-sum-exp and applies
// the gate: out = (sum_s 2^(m_s - M) o_s) / (sum_s 2^(m_s - M) l_s) * sigmoid(gate),
// M = max_s m_s, summed in split order; rows of a segment with one split were written by
// attn_decode and are left alone.
//   q: [rows][q_stride] f32 (gate halves read), part_o / part_ms: as attn_decode wrote
//   them, out: [rows][out_stride] f32; segs: the step's segments.
// Threadgroups (nq, rows) of any number of threads (MQ_ATTN_COMBINE_THREADS: one per 4 dims).
[[kernel]] void attn_decode_combine(device const float* q [[buffer(0)]],
                                    device const float* part_o [[buffer(1)]],
                                    device const float2* part_ms [[buffer(2)]],
                                    device float* out [[buffer(3)]],
                                    constant StepSegments& segs [[buffer(4)]],
                                    constant AttnDecodeParams& p [[buffer(5)]],
                                    uint2 tg [[threadgroup_position_in_grid]],
                                    uint tid [[thread_index_in_threadgroup]],
                                    uint tpg [[threads_per_threadgroup]]) {
  using namespace mq_attn;
  const uint head = tg.x;
  const uint row = tg.y;
  uint segment = 0;  // segments are contiguous in rows
  while (segment + 1 < segs.count && row >= segs.seg[segment].first_row + segs.seg[segment].rows) segment++;
  const uint n_splits = segment_splits(segs, p, segment);
  if (n_splits == 1) return;
  const ulong base = ((ulong)row * p.nq + head) * p.n_splits;
  float mx = NO_SCORE;
  for (uint s = 0; s < n_splits; s++) mx = max(mx, part_ms[base + s].x);
  for (uint d4 = tid; d4 < HD / 4; d4 += tpg) {
    float l = 0.0f;
    float4 acc = float4(0.0f);
    for (uint s = 0; s < n_splits; s++) {
      const float2 ms = part_ms[base + s];
      const float w = exp2(ms.x - mx);
      l += w * ms.y;
      acc += w * *(device const float4*)(part_o + (base + s) * HD + 4 * d4);
    }
    const float4 gate = *(device const float4*)(q + (ulong)row * p.q_stride + head * 2 * HD + HD + 4 * d4);
    *(device float4*)(out + (ulong)row * p.out_stride + head * HD + 4 * d4) = acc / l * sigmoid(gate);
  }
}

// ---------------------------------------------------------------------------------------
// Flash prefill: a chunk of rows against the cache (the chunk's own K/V appended), causal.
//   q:      [rows][q_stride] f32, readable for ceil(rows / 8) * 8 rows
//   kc, vc: this layer's caches, positions < pos_base + rows appended
//   out:    [rows][out_stride] f32, gated attention output
// Threadgroup (row block, kv head x head block): hb = min(n_rep, n_sg) query heads of the
// kv head (head block b of ceil(n_rep / hb): heads b hb ..) times rb = n_sg / hb blocks of
// 8 rows; SIMD-group sg = head sg % hb of the block, rows 8 (sg / hb) ... Per tile of 8 positions the threadgroup
// stages K and V in f32; each SIMD-group computes S = Q K^T (8x8, Q read from device),
// the online softmax row by row (4 lanes per row), and O = diag(2^(m - m')) O + P V with
// the rescale skipped when no row's maximum moved.
template <bool Q8>
[[max_total_threads_per_threadgroup(MQ_ATTN_PREFILL_THREADS)]]
[[kernel]] void attn_prefill(device const float* q [[buffer(0)]],
                             device const char* kc [[buffer(1)]],
                             device const char* vc [[buffer(2)]],
                             device float* out [[buffer(3)]],
                             constant AttnParams& p [[buffer(4)]],
                             uint2 tg [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]],
                             uint tpg [[threads_per_threadgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint n_sg [[simdgroups_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_attn;
  constexpr uint BK = 8;                // positions per tile
  constexpr uint TILE4 = BK * HD / 4;   // float4s in a staged K or V tile
  constexpr uint SCRATCH = MQ_ATTN_PREFILL_MAX_SIMDGROUPS * 64;  // one 8x8 f32 matrix per SIMD-group
  threadgroup float4 ks4[TILE4];
  threadgroup float4 vs4[TILE4];
  threadgroup float scratch[SCRATCH];
  threadgroup const float* ks = (threadgroup const float*)ks4;
  threadgroup const float* vs = (threadgroup const float*)vs4;
  threadgroup float* scr = scratch + sg * 64;

  const uint n_rep = p.nq / p.nkv;
  const uint hb = min(n_rep, n_sg);
  const uint rb = n_sg / hb;
  const uint head_blocks = (n_rep + hb - 1) / hb;
  const uint kvh = tg.y / head_blocks;
  const uint rep = tg.y % head_blocks * hb + sg % hb;
  const uint head = kvh * n_rep + rep;
  const uint tg_row0 = tg.x * 8 * rb;
  const uint tg_rows_end = min(tg_row0 + 8 * rb, p.rows);
  const uint row0 = tg_row0 + 8 * (sg / hb);
  const bool active = row0 < p.rows && rep < n_rep && sg < rb * hb;
  const uint kv_len = p.pos_base + tg_rows_end;                         // positions staged
  const uint kv_len_sg = active ? p.pos_base + min(row0 + 8, p.rows) : 0;  // positions this SIMD-group sees
  const uint kv_dim = p.nkv * HD;
  const ulong scale_off = (ulong)p.max_ctx * kv_dim;

  // Softmax state of row i = lane / 4; its 4 lanes hold copies and own columns 2 cp, 2 cp + 1.
  const uint i = lane / 4;
  const uint cp = lane % 4;
  const uint my_pos = p.pos_base + row0 + i;
  const bool row_ok = row0 + i < p.rows;
  float m = NO_SCORE;
  float l = 0.0f;
  simdgroup_float8x8 acc[HD / 8];
  for (uint c = 0; c < HD / 8; c++) acc[c] = make_filled_simdgroup_matrix<float, 8>(0.0f);
  device const float* qb = q + (ulong)row0 * p.q_stride + head * 2 * HD;

  for (uint t0 = 0; t0 < kv_len; t0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint u = tid; u < 2 * TILE4; u += tpg) {
      const bool is_v = u >= TILE4;
      const uint w = is_v ? u - TILE4 : u;
      const uint t = t0 + w / (HD / 4);
      // Positions past the chunk are zero: their p is 0, and 0 * (stale cache) must stay 0.
      const float4 val = t < kv_len ? kv_load4<Q8>(is_v ? vc : kc, scale_off, t, kv_dim, kvh * HD + 4 * (w % (HD / 4)))
                                    : float4(0.0f);
      if (is_v) vs4[w] = val; else ks4[w] = val;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (!active || t0 >= kv_len_sg) continue;  // uniform per SIMD-group

    simdgroup_float8x8 s = make_filled_simdgroup_matrix<float, 8>(0.0f);
    for (uint kk = 0; kk < HD / 8; kk++) {
      simdgroup_float8x8 qa;
      simdgroup_float8x8 kt;
      simdgroup_load(qa, qb + kk * 8, p.q_stride);
      simdgroup_load(kt, ks + kk * 8, HD, ulong2(0, 0), true);
      simdgroup_multiply_accumulate(s, qa, kt, s);
    }
    simdgroup_store(s, scr, 8);
    simdgroup_barrier(mem_flags::mem_threadgroup);

    // Rows past the chunk (q padding, maybe NaN) see no position: p = 0, factor 1, so
    // the diag(factor) product cannot carry their garbage into other rows (0 * NaN).
    const uint ta = t0 + 2 * cp;
    const bool va = row_ok && ta <= my_pos;
    const bool vb = row_ok && ta + 1 <= my_pos;
    const float sa = scr[i * 8 + 2 * cp] * SCORE_SCALE;
    const float sb = scr[i * 8 + 2 * cp + 1] * SCORE_SCALE;
    float mt = max(va ? sa : NO_SCORE, vb ? sb : NO_SCORE);
    mt = max(mt, simd_shuffle_xor(mt, 1));
    mt = max(mt, simd_shuffle_xor(mt, 2));
    const float mn = max(m, mt);
    const float f = exp2(m - mn);
    const float pa = va ? exp2(sa - mn) : 0.0f;
    const float pb = vb ? exp2(sb - mn) : 0.0f;
    float ps = pa + pb;
    ps += simd_shuffle_xor(ps, 1);
    ps += simd_shuffle_xor(ps, 2);
    l = l * f + ps;
    m = mn;
    scr[i * 8 + 2 * cp] = pa;
    scr[i * 8 + 2 * cp + 1] = pb;
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_float8x8 pm;
    simdgroup_load(pm, scr, 8);
    if (!simd_all(f == 1.0f)) {
      simdgroup_barrier(mem_flags::mem_threadgroup);
      scr[i * 8 + 2 * cp] = 2 * cp == i ? f : 0.0f;
      scr[i * 8 + 2 * cp + 1] = 2 * cp + 1 == i ? f : 0.0f;
      simdgroup_barrier(mem_flags::mem_threadgroup);
      simdgroup_float8x8 dm;
      simdgroup_load(dm, scr, 8);
      for (uint c = 0; c < HD / 8; c++) simdgroup_multiply(acc[c], dm, acc[c]);
    }
    for (uint c = 0; c < HD / 8; c++) {
      simdgroup_float8x8 vt;
      simdgroup_load(vt, vs + c * 8, HD);
      simdgroup_multiply_accumulate(acc[c], pm, vt, acc[c]);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);  // scr is rewritten by the next tile
  }
  if (!active) return;

  const uint row = row0 + i;
  const float inv = 1.0f / l;
  for (uint c = 0; c < HD / 8; c++) {
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_store(acc[c], scr, 8);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    if (row < p.rows) {
      const uint d = c * 8 + 2 * cp;
      device const float* gate = q + (ulong)row * p.q_stride + head * 2 * HD + HD + d;
      device float* dst = out + (ulong)row * p.out_stride + head * HD + d;
      dst[0] = scr[i * 8 + 2 * cp] * inv * sigmoid(gate[0]);
      dst[1] = scr[i * 8 + 2 * cp + 1] * inv * sigmoid(gate[1]);
    }
  }
}

