// Parameters of shaders/deltanet.metal: the Gated DeltaNet mixer between in_proj_* and
// out_proj (causal conv + silu, q/k L2 norms, gates, the recurrent scan, the gated
// output norm, and the speculative-rollback restore).
//
// The kernels are specialised for linear head dims d_k = d_v = MQ_DELTA_HEAD_DIM (a
// SIMD-group's 32 lanes x float4 cover one head). The engine must check the model's
// linear_key_head_dim and linear_value_head_dim against it at load time and refuse
// other models. n_v must be a multiple of n_k (v-head h reads k-head h / (n_v / n_k)).
#pragma once

#define MQ_DELTA_HEAD_DIM 128

// Buffers shared by the kernels (f32 unless stated), D = MQ_DELTA_HEAD_DIM,
// C = 2 * n_k * D + n_v * D conv channels, ordered [q (n_k*D) | k (n_k*D) | v (n_v*D)]:
//   x       [rows][x_stride]: in_proj_qkv output (raw conv input), channels 0..C
//   conv_w  bf16 [C][K]: tap j of channel c at c*K + j; tap K-1 multiplies the current row
//   hist    [K-1][C]: the last K-1 raw inputs of each channel, oldest first (plane i,
//           channel c at i*C + c); nothing when K == 1
//   qkv     [rows][C]: conv output: q (L2-normalised, times 1/sqrt(D)) | k (L2-normalised) | v
//   a, b    [rows][ab_stride]: in_proj_a / in_proj_b outputs, head h at column h
//   a_log   [n_v] f32 or bf16 (two kernel variants); dt_bias bf16 [n_v]
//   gates   float2 [rows][n_v]: (decay, beta)
//   z       [rows][z_stride]: in_proj_z output, v-head h at h*D
//   norm_w  bf16 [D]: output norm weight, multiplied as stored (NOT shifted)
//   state   [n_v][D (dv)][D (dk)]: S[h][i][j], row i (a dv index) contiguous over dk
//   out     [rows][n_v*D]: gated-norm output, the input of out_proj
// Snapshots for speculative rollback: plane t (t < snap_rows) holds the history / state
// as it is AFTER row t, at hist_snaps + t*hist_snap_stride (layout of hist) and
// state_snaps + t*state_snap_stride (layout of state). Strides are in floats, so the
// engine may interleave layers (plane stride = layers * plane size) and restore every
// layer with one delta_restore dispatch.
// All bindings 16-byte aligned; x_stride a multiple of 4 (float4 loads).

// delta_conv_prep_alog_{f32,bf16}: causal depthwise conv + silu over `rows` rows, then the
// q/k L2 norms, and for v-head h the gates decay = exp(-exp(A_log) * softplus(a + dt_bias)),
// beta = sigmoid(b). One threadgroup per 128-channel head block: dispatch (2*n_k + n_v)
// threadgroups of 32 * s threads, any s in 1..32 (SIMD-group g takes rows g, g+s, ...;
// MQ_DELTA_CONV_SIMDGROUPS is a good choice for prefill, 1 for a decode row).
// x and qkv must not alias (the conv reads raw inputs of earlier rows).
#define MQ_DELTA_CONV_SIMDGROUPS 4
struct DeltaConvParams {
  uint n_k;               // key heads
  uint n_v;               // value heads
  uint ksize;             // conv kernel size K >= 1
  uint rows;              // token rows in this step
  uint snap_rows;         // history snapshots after rows [0, snap_rows); 0 = none
  uint x_stride;          // floats between rows of x (>= C)
  uint ab_stride;         // floats between rows of a and of b (>= n_v)
  uint hist_snap_stride;  // floats between history snapshot planes
  float qk_eps;           // inside the L2 norms' sqrt (1e-6)
};

// delta_scan_norm: the recurrent scan, per row t and v-head h (k-head h / (n_v / n_k)):
//   S *= decay; kv = S k; S += ((v - kv) * beta) outer k; y = S q
// then, when gated_norm != 0, out = y * rsqrt(mean_D(y^2) + eps) * norm_w * silu(z)
// (else out = y, for diagnostics). One threadgroup per v-head: dispatch n_v threadgroups
// of any multiple of 32 threads up to MQ_DELTA_SCAN_THREADS (its declared maximum, the
// best size: each SIMD-group then owns MQ_DELTA_SCAN_ROWS dv rows of the head's state in
// registers; fewer SIMD-groups take several such blocks in turn).
#define MQ_DELTA_SCAN_ROWS 8
#define MQ_DELTA_SCAN_THREADS (32 * MQ_DELTA_HEAD_DIM / MQ_DELTA_SCAN_ROWS)
struct DeltaScanParams {
  uint n_k;
  uint n_v;
  uint rows;
  uint snap_rows;          // state snapshots after rows [0, snap_rows); 0 = none
  uint z_stride;           // floats between rows of z (>= n_v * D, multiple of 4)
  uint state_snap_stride;  // floats between state snapshot planes
  uint gated_norm;         // 1: gated output norm (the model); 0: raw y
  float norm_eps;          // rms_norm_eps of the output norm
};

// delta_restore: state = state_snaps[plane], hist = hist_snaps[plane] (rejecting the
// speculative rows after row `plane`), with `plane` read from a device word (the verify
// step's accepted-draft count) and nothing copied when it is >= planes. Each thread copies
// a float4: dispatch ceil((state_floats + hist_floats) / 4) threads, any threadgroup size;
// both sizes must be multiples of 4 (they are, as multiples of D).
struct DeltaRestoreParams {
  uint state_floats;       // floats of state to copy (n_v * D * D, or all layers' states)
  uint hist_floats;        // floats of hist to copy ((K-1) * C, or all layers')
  uint state_snap_stride;  // floats between state snapshot planes
  uint hist_snap_stride;   // floats between history snapshot planes
  uint planes;             // snapshot planes held: a plane >= planes keeps the live state
};
