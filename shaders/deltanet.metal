// Gated DeltaNet mixer core, between the in_proj_* matvecs and out_proj (DESIGN.md
// section 2), in two dispatches per layer and step:
//   delta_conv_prep: causal conv + silu, q/k L2 norms, decay/beta gates, history snapshots
//   delta_scan_norm: recurrent scan + gated output norm, state snapshots
// plus delta_restore for speculative rollback. Buffer layouts: shaders/params/deltanet.h.
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

// log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow, and for e = e^-|x| < 1e-4 the
// series e - e^2/2 keeps the relative accuracy that log(1 + e) loses (it is 0 below 6e-8).
inline float softplus(float x) {
  const float e = exp(-fabs(x));
  const float tail = e < 1e-4f ? e * (1.0f - 0.5f * e) : log(1.0f + e);
  return max(x, 0.0f) + tail;
}

// Element m of one channel group's input sequence [history (K-1 rows) | x (rows)],
// four consecutive channels from c0: m < K-1 reads history plane m, else row m-(K-1) of x.
inline float4 conv_input(device const float* x, device const float* hist, uint km1, uint x_stride, uint channels,
                         uint m, uint c0) {
  return m < km1 ? *(device const float4*)(hist + (ulong)m * channels + c0)
                 : *(device const float4*)(x + (ulong)(m - km1) * x_stride + c0);
}

}  // namespace mq_delta

// Causal depthwise conv + silu, then per 128-channel head block: q and k blocks are
// L2-normalised (q also scaled by 1/sqrt(D)); the SIMD-group of v-head h also writes
// that head's gates (decay, beta). Snapshots and the history update of DeltaConvParams.
//   x [rows][x_stride] raw inputs; conv_w W [C][K]; hist [K-1][C] (read, then updated);
//   qkv [rows][C] out (must not alias x); a, b [rows][ab_stride]; a_log [n_v] (ALogT);
//   dt_bias W [n_v]; gates float2 [rows][n_v] out; hist_snaps planes of [K-1][C].
//   W is bfloat, or float for checkpoints whose vectors are f32/f16 (host names *_wf32).
// Grid: threadgroup = head block (2*n_k + n_v of them); 32*s threads, SIMD-group g takes
// rows g, g+s, ...; lane l owns channels block*D + 4l .. 4l+3.
// Numerics: conv taps accumulate by fma in tap order j = 0..K-1 from zero.
template <typename ALogT, typename W>
[[kernel]] void delta_conv_prep(device const float* x [[buffer(0)]],
                                device const W* conv_w [[buffer(1)]],
                                device float* hist [[buffer(2)]],
                                device float* qkv [[buffer(3)]],
                                device const float* a [[buffer(4)]],
                                device const float* b [[buffer(5)]],
                                device const ALogT* a_log [[buffer(6)]],
                                device const W* dt_bias [[buffer(7)]],
                                device float2* gates [[buffer(8)]],
                                device float* hist_snaps [[buffer(9)]],
                                constant DeltaConvParams& p [[buffer(10)]],
                                uint block [[threadgroup_position_in_grid]],
                                uint sg [[simdgroup_index_in_threadgroup]],
                                uint n_sg [[simdgroups_per_threadgroup]],
                                uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_delta;
  const uint qk = p.n_k * D;
  const uint channels = 2 * qk + p.n_v * D;
  const uint K = p.ksize;
  const uint km1 = K - 1;
  const uint c0 = block * D + lane * 4;
  const bool is_q = block < p.n_k;
  const bool is_v = block >= 2 * p.n_k;  // uniform over the threadgroup
  device const W* w0 = conv_w + (ulong)c0 * K;

  for (uint t = sg; t < p.rows; t += n_sg) {
    float4 acc = 0.0f;
    for (uint j = 0; j < K; j++) {
      const float4 w = float4((float)w0[j], (float)w0[K + j], (float)w0[2 * K + j], (float)w0[3 * K + j]);
      acc = fma(w, conv_input(x, hist, km1, p.x_stride, channels, t + j, c0), acc);
    }
    float4 y = silu(acc);
    if (!is_v) {
      const float ss = simd_sum(dot(y, y));
      float scale = rsqrt(ss + p.qk_eps);
      if (is_q) scale *= rsqrt((float)D);
      y *= scale;
    } else if (lane == 0) {
      const uint h = block - 2 * p.n_k;
      const ulong ab = (ulong)t * p.ab_stride + h;
      const float dt = softplus(a[ab] + (float)dt_bias[h]);
      gates[(ulong)t * p.n_v + h] = float2(exp(-exp((float)a_log[h]) * dt), sigmoid(b[ab]));
    }
    *(device float4*)(qkv + (ulong)t * channels + c0) = y;
    // History after row t = inputs t+1 .. t+K-1 of the combined sequence.
    if (t < p.snap_rows) {
      device float* plane = hist_snaps + (ulong)t * p.hist_snap_stride;
      for (uint i = 0; i < km1; i++) {
        *(device float4*)(plane + (ulong)i * channels + c0) =
            conv_input(x, hist, km1, p.x_stride, channels, t + 1 + i, c0);
      }
    }
  }

  // Every SIMD-group has read the old history; now keep the last K-1 inputs. Plane i
  // takes input rows + i, which is old plane rows + i > i (not yet overwritten) or a row of x.
  threadgroup_barrier(mem_flags::mem_device);
  if (sg == 0) {
    for (uint i = 0; i < km1; i++) {
      const float4 v = conv_input(x, hist, km1, p.x_stride, channels, p.rows + i, c0);
      *(device float4*)(hist + (ulong)i * channels + c0) = v;
    }
  }
}

template [[host_name("delta_conv_prep_alog_f32")]] [[kernel]] void delta_conv_prep<float, bfloat>(
    device const float* x [[buffer(0)]], device const bfloat* conv_w [[buffer(1)]], device float* hist [[buffer(2)]],
    device float* qkv [[buffer(3)]], device const float* a [[buffer(4)]], device const float* b [[buffer(5)]],
    device const float* a_log [[buffer(6)]], device const bfloat* dt_bias [[buffer(7)]], device float2* gates [[buffer(8)]],
    device float* hist_snaps [[buffer(9)]], constant DeltaConvParams& p [[buffer(10)]],
    uint block [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("delta_conv_prep_alog_bf16")]] [[kernel]] void delta_conv_prep<bfloat, bfloat>(
    device const float* x [[buffer(0)]], device const bfloat* conv_w [[buffer(1)]], device float* hist [[buffer(2)]],
    device float* qkv [[buffer(3)]], device const float* a [[buffer(4)]], device const float* b [[buffer(5)]],
    device const bfloat* a_log [[buffer(6)]], device const bfloat* dt_bias [[buffer(7)]], device float2* gates [[buffer(8)]],
    device float* hist_snaps [[buffer(9)]], constant DeltaConvParams& p [[buffer(10)]],
    uint block [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("delta_conv_prep_alog_f32_wf32")]] [[kernel]] void delta_conv_prep<float, float>(
    device const float* x [[buffer(0)]], device const float* conv_w [[buffer(1)]], device float* hist [[buffer(2)]],
    device float* qkv [[buffer(3)]], device const float* a [[buffer(4)]], device const float* b [[buffer(5)]],
    device const float* a_log [[buffer(6)]], device const float* dt_bias [[buffer(7)]], device float2* gates [[buffer(8)]],
    device float* hist_snaps [[buffer(9)]], constant DeltaConvParams& p [[buffer(10)]],
    uint block [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]);

// The recurrent scan of one v-head over `rows` rows, then the gated output norm.
// The head's D dv rows form blocks of R = MQ_DELTA_SCAN_ROWS; SIMD-group g scans blocks
// g, g + n_sg, ... one after another, each kept in registers for all rows, lane l holding
// dk elements 4l..4l+3 of each block row. Per row t, using S_new q = decay (S_old q) +
// delta (k.q), all 2R+1 dot products read the old state, so their SIMD reductions are
// independent; then S = decay S + delta k elementwise. y goes to out; once every block is
// done (one device barrier) each row is normalised in place by one SIMD-group.
//   qkv [rows][C] from delta_conv_prep; gates float2 [rows][n_v]; z [rows][z_stride];
//   norm_w W [D] (bfloat, or float: host name delta_scan_norm_wf32); state [n_v][D][D]
//   read-write; out [rows][n_v*D];
//   state_snaps planes of [n_v][D][D].
// Grid: n_v threadgroups (threadgroup = v-head) of any multiple of 32 threads up to
// MQ_DELTA_SCAN_THREADS (one block per SIMD-group there).
// Numerics (keep: verify rows must reproduce decode rows bit for bit, and they do
// because every row runs the same code whatever `rows` is): a row's norm sums lane
// partials of 4 y^2 each by simd_sum, whatever the threadgroup size.
template <typename W>
[[max_total_threads_per_threadgroup(MQ_DELTA_SCAN_THREADS)]]
[[kernel]] void delta_scan_norm(device const float* qkv [[buffer(0)]],
                                device const float2* gates [[buffer(1)]],
                                device const float* z [[buffer(2)]],
                                device const W* norm_w [[buffer(3)]],
                                device float* state [[buffer(4)]],
                                device float* out [[buffer(5)]],
                                device float* state_snaps [[buffer(6)]],
                                constant DeltaScanParams& p [[buffer(7)]],
                                uint head [[threadgroup_position_in_grid]],
                                uint sg [[simdgroup_index_in_threadgroup]],
                                uint n_sg [[simdgroups_per_threadgroup]],
                                uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_delta;
  const uint qk = p.n_k * D;
  const uint channels = 2 * qk + p.n_v * D;
  const uint vdim = p.n_v * D;
  const uint hk = head / (p.n_v / p.n_k);

  for (uint block = sg; block < SCAN_BLOCKS; block += n_sg) {
    const uint row0 = block * SCAN_ROWS;
    const ulong state_off = ((ulong)head * D + row0) * D + lane * 4;
    float4 s[SCAN_ROWS];
    for (uint r = 0; r < SCAN_ROWS; r++) s[r] = *(device const float4*)(state + state_off + r * D);

    for (uint t = 0; t < p.rows; t++) {
      device const float* row = qkv + (ulong)t * channels;
      const float4 q4 = *(device const float4*)(row + hk * D + lane * 4);
      const float4 k4 = *(device const float4*)(row + qk + hk * D + lane * 4);
      device const float* v = row + 2 * qk + head * D + row0;
      const float2 g = gates[(ulong)t * p.n_v + head];
      const float decay = g.x;
      const float beta = g.y;

      const float kq = simd_sum(dot(k4, q4));
      float sk[SCAN_ROWS];
      float sq[SCAN_ROWS];
      for (uint r = 0; r < SCAN_ROWS; r++) {
        sk[r] = simd_sum(dot(s[r], k4));
        sq[r] = simd_sum(dot(s[r], q4));
      }

      float y_mine = 0.0f;  // lane r < R ends up with block row r's output
      for (uint r = 0; r < SCAN_ROWS; r++) {
        const float delta = (v[r] - decay * sk[r]) * beta;
        s[r] = fma(k4, delta, s[r] * decay);
        const float y = fma(decay, sq[r], delta * kq);
        y_mine = lane == r ? y : y_mine;
      }
      if (lane < SCAN_ROWS) out[(ulong)t * vdim + head * D + row0 + lane] = y_mine;

      if (t < p.snap_rows) {
        device float* plane = state_snaps + (ulong)t * p.state_snap_stride + state_off;
        for (uint r = 0; r < SCAN_ROWS; r++) *(device float4*)(plane + r * D) = s[r];
      }
    }
    for (uint r = 0; r < SCAN_ROWS; r++) *(device float4*)(state + state_off + r * D) = s[r];
  }
  if (p.gated_norm == 0) return;

  // out = y * rsqrt(mean(y^2) + eps) * w * silu(z) over the head, row t by SIMD-group t % n_sg.
  threadgroup_barrier(mem_flags::mem_device);
  const float4 w = float4((float)norm_w[lane * 4], (float)norm_w[lane * 4 + 1], (float)norm_w[lane * 4 + 2],
                          (float)norm_w[lane * 4 + 3]);
  for (uint t = sg; t < p.rows; t += n_sg) {
    device float4* o = (device float4*)(out + (ulong)t * vdim + head * D + lane * 4);
    const float4 y = *o;
    const float inv = rsqrt(simd_sum(dot(y, y)) / (float)D + p.norm_eps);
    const float4 zv = *(device const float4*)(z + (ulong)t * p.z_stride + head * D + lane * 4);
    *o = y * inv * w * silu(zv);
  }
}

template [[host_name("delta_scan_norm")]] [[kernel]] void delta_scan_norm<bfloat>(
    device const float* qkv [[buffer(0)]], device const float2* gates [[buffer(1)]], device const float* z [[buffer(2)]],
    device const bfloat* norm_w [[buffer(3)]], device float* state [[buffer(4)]], device float* out [[buffer(5)]],
    device float* state_snaps [[buffer(6)]], constant DeltaScanParams& p [[buffer(7)]],
    uint head [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("delta_scan_norm_wf32")]] [[kernel]] void delta_scan_norm<float>(
    device const float* qkv [[buffer(0)]], device const float2* gates [[buffer(1)]], device const float* z [[buffer(2)]],
    device const float* norm_w [[buffer(3)]], device float* state [[buffer(4)]], device float* out [[buffer(5)]],
    device float* state_snaps [[buffer(6)]], constant DeltaScanParams& p [[buffer(7)]],
    uint head [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint n_sg [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]);

// Rollback after a rejected speculative draft: state and conv history become snapshot
// plane `*plane` (the state after that row), read on the device because the verify step
// that decides it runs in the same command buffer; a plane >= planes (every row kept)
// leaves both untouched. Copies float4s: indices below state_floats/4 go to the state,
// the rest to the history.
//   state, hist: layouts of params/deltanet.h (or several layers back to back);
//   state_snaps, hist_snaps: planes at multiples of the snap strides (multiples of 4);
//   plane uint [1].
// Grid: ceil((state_floats + hist_floats) / 4) threads, any threadgroup size.
[[kernel]] void delta_restore(device float4* state [[buffer(0)]],
                              device const float4* state_snaps [[buffer(1)]],
                              device float4* hist [[buffer(2)]],
                              device const float4* hist_snaps [[buffer(3)]],
                              device const uint* plane [[buffer(4)]],
                              constant DeltaRestoreParams& p [[buffer(5)]],
                              uint i [[thread_position_in_grid]]) {
  const uint from = plane[0];
  if (from >= p.planes) return;
  const uint ns = p.state_floats / 4;
  const uint nh = p.hist_floats / 4;
  if (i < ns) {
    state[i] = state_snaps[(ulong)from * (p.state_snap_stride / 4) + i];
  } else if (i - ns < nh) {
    hist[i - ns] = hist_snaps[(ulong)from * (p.hist_snap_stride / 4) + (i - ns)];
  }
}
