// Gated DeltaNet mixer core, between the in_proj_* matvecs and out_proj (docs/design.md,
// "Gated DeltaNet"):
//   delta_conv_scan: causal conv + silu, q/k L2 norms, decay/beta gates, the recurrent
//                    scan, the gated output norm but its per-head factor (g = y * norm_w *
//                    silu(z) and partial sums of y^2), state snapshots, and in decode and
//                    verify steps the conv inputs into the history ring; SIMD-groups
//                    independent
//   delta_norm_history: prefill only, after the scan: the per-head factor in place and
//                    the conv inputs into the ring (decode and verify steps leave the
//                    factor to out_proj's input load, qmv_head_norm.h)
// plus delta_restore for speculative rollback. Buffer layouts: shaders/params/deltanet.h.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

namespace mq_delta {

constant constexpr uint D = MQ_DELTA_HEAD_DIM;
constant constexpr uint SCAN_ROWS = MQ_DELTA_SCAN_ROWS;
constant constexpr uint SCAN_BLOCKS = MQ_DELTA_HEAD_DIM / MQ_DELTA_SCAN_ROWS;

// silu(x) = x * sigmoid(x); the exponent is clamped so fast math never forms inf/inf.
inline float silu(float x) { return x / (1.0f + exp(min(-x, 88.0f))); }
inline float4 silu(float4 x) { return x / (1.0f + exp(min(-x, 88.0f))); }

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(min(-x, 88.0f))); }

// The gated norm's factor rsqrt(mean(y^2) + eps) of one head's row from its scan partials
// (MQ_DELTA_HEAD_PARTIALS floats, 16-byte aligned), summed in one fixed order, so out_proj's
// fold (qmv_head_norm) and the prefill pass (delta_norm_history) apply the same bits.
inline float head_norm_inv(device const float* partials, float eps) {
  device const float4* p4 = (device const float4*)partials;
  float4 s = p4[0];
  for (uint i = 1; i < MQ_DELTA_HEAD_PARTIALS / 4; i++) s += p4[i];
  return rsqrt(((s.x + s.y) + (s.z + s.w)) / (float)D + eps);
}

// log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow, and for e = e^-|x| < 1e-4 the
// series e - e^2/2 keeps the relative accuracy that log(1 + e) loses (it is 0 below 6e-8).
inline float softplus(float x) {
  const float e = exp(-fabs(x));
  const float tail = e < 1e-4f ? e * (1.0f - 0.5f * e) : log(1.0f + e);
  return max(x, 0.0f) + tail;
}

// Raw conv input of position `position + m` (m < 0: the history ring, or zero before the
// sequence; m >= 0: row m of x) for channels c0 .. c0+3, or c0 alone (the scalar form).
struct ConvInputs {
  device const float* x;
  device const float* hist;
  uint x_stride, channels, position, slots;

  device const float* at(int m, uint c0) const {
    if (m >= 0) return x + (ulong)m * x_stride + c0;
    return hist + (ulong)((position + m) % slots) * channels + c0;  // only for position + m >= 0
  }
  float4 load4(int m, uint c0) const {
    return (int)position + m < 0 ? float4(0.0f) : *(device const float4*)at(m, c0);
  }
  float load1(int m, uint c) const { return (int)position + m < 0 ? 0.0f : *at(m, c); }
};

// silu(sum_j w[j] * input(t - K + 1 + j)) for 4 channels from c0 (taps fma'd in order j =
// 0..K-1 from zero: verify rows and decode rows get the same bits).
template <typename W>
inline float4 conv4(ConvInputs in, device const W* w, uint K, int t, uint c0) {
  device const W* w0 = w + (ulong)c0 * K;
  float4 acc = 0.0f;
  for (uint j = 0; j < K; j++) {
    const float4 wj = float4((float)w0[j], (float)w0[K + j], (float)w0[2 * K + j], (float)w0[3 * K + j]);
    acc = fma(wj, in.load4(t - (int)(K - 1) + (int)j, c0), acc);
  }
  return silu(acc);
}
template <typename W>
inline float conv1(ConvInputs in, device const W* w, uint K, int t, uint c) {
  device const W* w0 = w + (ulong)c * K;
  float acc = 0.0f;
  for (uint j = 0; j < K; j++) acc = fma((float)w0[j], in.load1(t - (int)(K - 1) + (int)j, c), acc);
  return silu(acc);
}

}  // namespace mq_delta

// Conv, norms, gates and the scan of MQ_DELTA_SCAN_ROWS dv rows of one v-head per
// SIMD-group (global SIMD-group index i: head i / SCAN_BLOCKS, rows (i % SCAN_BLOCKS) * R
// .. + R-1), for every row t in turn. Lane l holds dk elements 4l..4l+3 of the block's R
// state rows and convolves q/k channels 4l..4l+3 of the head's k-head itself (every
// SIMD-group of that k-head repeats these K-tap sums: cheaper than a barrier); lane l also
// convolves the v channel of block row l % R, broadcast by simd_shuffle. Per row, using
// S_new q = decay (S_old q) + delta (k.q), all 2R+1 dot products read the old state, so
// their SIMD reductions are independent; then S = decay S + delta k elementwise. The block's
// outputs leave gated, g = y * norm_w * silu(z), with sum(y^2) over the block in head_ss.
// With p.store_history each SIMD-group copies its R v channels of the row into the ring,
// and the first block of a k-head's first v-head its q and k channels: positions the
// step reads are other ring slots (params/deltanet.h), so no SIMD-group waits.
//   x [rows][x_stride] raw inputs; conv_w W [C][K]; hist [slots][hist_slots][C] ring;
//   a, b [rows][ab_stride]; a_log [n_v] (ALogT); dt_bias W [n_v]; z [rows][z_stride];
//   norm_w [D] bf16, or f32 when p.norm_f32; state [slots][n_v][D][D] read-write;
//   out [rows][n_v*D] g; head_ss [rows][ss_stride] (head h's partials at
//   h * MQ_DELTA_HEAD_PARTIALS); state_snaps [slots][planes of [n_v][D][D]];
//   segs: the step's segments (params/common.h).
//   W is bfloat, or float for checkpoints whose vectors are f32/f16 (host names *_wf32).
// Grid: (ceil(n_v * SCAN_BLOCKS / s), segments) threadgroups of 32 * s threads; SIMD-groups
// past the last block do nothing. Threadgroup (g, i) runs segment i's rows from its slot.
// Numerics: every row runs the same code whatever the segment's rows, s or the other
// segments are, so verify rows reproduce decode rows and a sequence batched with others
// reproduces itself alone, bit for bit; q/k norms sum lane partials of 4 squares by simd_sum.
template <typename ALogT, typename W>
[[max_total_threads_per_threadgroup(MQ_DELTA_SCAN_THREADS)]]
[[kernel]] void delta_conv_scan(device const float* x [[buffer(0)]],
                                device const W* conv_w [[buffer(1)]],
                                device float* hist [[buffer(2)]],
                                device const float* a [[buffer(3)]],
                                device const float* b [[buffer(4)]],
                                device const ALogT* a_log [[buffer(5)]],
                                device const W* dt_bias [[buffer(6)]],
                                device const float* z [[buffer(7)]],
                                device const uchar* norm_w [[buffer(8)]],
                                device float* state [[buffer(9)]],
                                device float* out [[buffer(10)]],
                                device float* head_ss [[buffer(11)]],
                                device float* state_snaps [[buffer(12)]],
                                constant StepSegments& segs [[buffer(13)]],
                                constant DeltaScanParams& p [[buffer(14)]],
                                uint2 group [[threadgroup_position_in_grid]],
                                uint sg [[simdgroup_index_in_threadgroup]],
                                uint n_sg [[simdgroups_per_threadgroup]],
                                uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_delta;
  const uint index = group.x * n_sg + sg;
  if (index >= p.n_v * SCAN_BLOCKS) return;
  // This threadgroup's segment: its rows of the step's activations, its slot's memory.
  const uint slot = segs.seg[group.y].slot, first_row = segs.seg[group.y].first_row;
  const uint rows = segs.seg[group.y].rows, position = segs.seg[group.y].position;
  x += (ulong)first_row * p.x_stride;
  a += (ulong)first_row * p.ab_stride;
  b += (ulong)first_row * p.ab_stride;
  z += (ulong)first_row * p.z_stride;
  head_ss += (ulong)first_row * p.ss_stride;
  hist += (ulong)slot * p.hist_slot_stride;
  state += (ulong)slot * p.state_slot_stride;
  state_snaps += (ulong)slot * p.snap_slot_stride;
  const uint head = index / SCAN_BLOCKS;
  const uint row0 = (index % SCAN_BLOCKS) * SCAN_ROWS;
  const uint qk = p.n_k * D;
  const uint vdim = p.n_v * D;
  const uint hk = head / (p.n_v / p.n_k);
  const uint K = p.ksize;
  const uint channels = 2 * qk + vdim;
  out += (ulong)first_row * vdim;
  const ConvInputs in{x, hist, p.x_stride, channels, position, p.hist_slots};
  const uint q_c = hk * D + lane * 4;
  const uint k_c = qk + q_c;
  const uint v_c = 2 * qk + head * D + row0 + lane % SCAN_ROWS;
  const float a_rate = exp((float)a_log[head]);
  const float bias = (float)dt_bias[head];
  // Lane r < R: block row r (dv index row0 + r), its output element and its norm weight.
  const uint dv_mine = row0 + lane % SCAN_ROWS;
  const uint e_mine = head * D + dv_mine;
  const float w_mine = p.norm_f32 ? ((device const float*)norm_w)[dv_mine] : (float)((device const bfloat*)norm_w)[dv_mine];
  const bool stores_qk = head % (p.n_v / p.n_k) == 0 && row0 == 0;

  const ulong state_off = ((ulong)head * D + row0) * D + lane * 4;
  float4 s[SCAN_ROWS];
  for (uint r = 0; r < SCAN_ROWS; r++) s[r] = *(device const float4*)(state + state_off + r * D);

  for (uint t = 0; t < rows; t++) {
    if (p.store_history) {
      device float* ring_row = hist + (ulong)((position + t) % p.hist_slots) * channels;
      device const float* x_row = x + (ulong)t * p.x_stride;
      const uint v4 = 2 * qk + head * D + row0 + 4 * lane;  // lanes < R / 4: this block's v channels
      if (lane < SCAN_ROWS / 4) *(device float4*)(ring_row + v4) = *(device const float4*)(x_row + v4);
      if (stores_qk) {
        *(device float4*)(ring_row + q_c) = *(device const float4*)(x_row + q_c);
        *(device float4*)(ring_row + k_c) = *(device const float4*)(x_row + k_c);
      }
    }
    float4 q4 = conv4(in, conv_w, K, (int)t, q_c);
    float4 k4 = conv4(in, conv_w, K, (int)t, k_c);
    q4 *= rsqrt(simd_sum(dot(q4, q4)) + p.qk_eps) * rsqrt((float)D);
    k4 *= rsqrt(simd_sum(dot(k4, k4)) + p.qk_eps);
    const float v_mine = conv1(in, conv_w, K, (int)t, v_c);
    const ulong ab = (ulong)t * p.ab_stride + head;
    const float decay = exp(-a_rate * softplus(a[ab] + bias));
    const float beta = sigmoid(b[ab]);

    const float kq = simd_sum(dot(k4, q4));
    float sk[SCAN_ROWS];
    float sq[SCAN_ROWS];
    for (uint r = 0; r < SCAN_ROWS; r++) {
      sk[r] = simd_sum(dot(s[r], k4));
      sq[r] = simd_sum(dot(s[r], q4));
    }

    float y_mine = 0.0f;  // lane r < R ends up with block row r's output
    for (uint r = 0; r < SCAN_ROWS; r++) {
      const float delta = (simd_shuffle(v_mine, (ushort)r) - decay * sk[r]) * beta;
      s[r] = fma(k4, delta, s[r] * decay);
      const float y = fma(decay, sq[r], delta * kq);
      y_mine = lane == r ? y : y_mine;
    }
    const float ss = simd_sum(lane < SCAN_ROWS ? y_mine * y_mine : 0.0f);
    if (lane < SCAN_ROWS) out[(ulong)t * vdim + e_mine] = y_mine * w_mine * silu(z[(ulong)t * p.z_stride + e_mine]);
    if (lane == 0) head_ss[(ulong)t * p.ss_stride + index] = ss;

    if (t < p.snap_rows && t + 1 < rows) {  // a segment's last row is never rolled back to
      device float* plane = state_snaps + (ulong)t * p.state_snap_stride + state_off;
      for (uint r = 0; r < SCAN_ROWS; r++) *(device float4*)(plane + r * D) = s[r];
    }
  }
  for (uint r = 0; r < SCAN_ROWS; r++) *(device float4*)(state + state_off + r * D) = s[r];
}


// A prefill step's second stage, after every SIMD-group of delta_conv_scan, per segment
// (grid y: segment i's rows, its slot's ring). Threadgroup h < n_v: v-head h's gated norm
// factor (head_norm_inv) applied to g in place, row t by SIMD-group t % s. Threadgroup
// n_v + b: channel block b (lane l: channels b*D + 4l .. +3) of the segment's last
// min(rows, hist_slots) rows of x into its history ring, row t by SIMD-group t % s; distinct
// rows hit distinct ring slots.
//   x [rows][x_stride] raw conv inputs; head_ss [rows][ss_stride] the scan's partials;
//   out [rows][n_v*D] g in, normalised out; hist [slots][hist_slots][C] rings, written;
//   segs: the step's segments (params/common.h).
// Grid: (n_v + C / D, segments) threadgroups of 32 * s threads.
[[kernel]] void delta_norm_history(device const float* x [[buffer(0)]],
                                   device const float* head_ss [[buffer(1)]],
                                   device float* out [[buffer(2)]],
                                   device float* hist [[buffer(3)]],
                                   constant StepSegments& segs [[buffer(4)]],
                                   constant DeltaNormParams& p [[buffer(5)]],
                                   uint2 tg [[threadgroup_position_in_grid]],
                                   uint sg [[simdgroup_index_in_threadgroup]],
                                   uint n_sg [[simdgroups_per_threadgroup]],
                                   uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_delta;
  const uint vdim = p.n_v * D;
  const uint group = tg.x;
  const uint slot = segs.seg[tg.y].slot, first_row = segs.seg[tg.y].first_row;
  const uint rows = segs.seg[tg.y].rows, position = segs.seg[tg.y].position;
  if (group < p.n_v) {
    const uint head = group;
    for (uint t = sg; t < rows; t += n_sg) {
      const ulong row = first_row + t;
      const float inv = head_norm_inv(head_ss + row * p.ss_stride + head * MQ_DELTA_HEAD_PARTIALS, p.norm_eps);
      device float4* o = (device float4*)(out + row * vdim + head * D + lane * 4);
      *o = *o * inv;
    }
    return;
  }
  const uint channels = 2 * p.n_k * D + vdim;
  const uint c0 = (group - p.n_v) * D + lane * 4;
  device float* ring = hist + (ulong)slot * p.hist_slot_stride;
  const uint first = rows > p.hist_slots ? rows - p.hist_slots : 0;
  for (uint t = first + sg; t < rows; t += n_sg) {
    *(device float4*)(ring + (ulong)((position + t) % p.hist_slots) * channels + c0) =
        *(device const float4*)(x + (ulong)(first_row + t) * p.x_stride + c0);
  }
}

// Rollback after a rejected speculative draft: state becomes snapshot plane `*plane` (the
// state after that row), read on the device because the verify step that decides it runs
// in the same command buffer; a plane >= planes (every row kept) leaves it untouched. The
// conv history needs nothing: its ring keeps every position by index (params/deltanet.h).
//   state: layout of params/deltanet.h (or several layers back to back);
//   state_snaps: planes at multiples of state_snap_stride (a multiple of 4); plane uint [1].
// Grid: state_floats / 4 threads, any threadgroup size.
[[kernel]] void delta_restore(device float4* state [[buffer(0)]],
                              device const float4* state_snaps [[buffer(1)]],
                              device const uint* plane [[buffer(2)]],
                              constant DeltaRestoreParams& p [[buffer(3)]],
                              uint i [[thread_position_in_grid]]) {
  const uint from = plane[0];
  if (from >= p.planes || i >= p.state_floats / 4) return;
  state[i] = state_snaps[(ulong)from * (p.state_snap_stride / 4) + i];
}
