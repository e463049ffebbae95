// Parameters of shaders/deltanet.metal: the Gated DeltaNet mixer between in_proj_* and
// out_proj (causal conv + silu, q/k L2 norms, gates, the recurrent scan and the gated output
// norm's elementwise part in one kernel; the norm's per-head factor where out_proj reads its
// input, or in place for prefill; the speculative-rollback restore of the state).
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
//   hist    [hist_slots][C]: the conv history as a ring indexed by absolute position: the
//           raw input of position p, channel c at (p % hist_slots)*C + c. Positions < 0
//           read as zero (the causal padding), so a new sequence needs no clearing.
//   a, b    [rows][ab_stride]: in_proj_a / in_proj_b outputs, head h at column h
//   a_log   [n_v] f32 or bf16 (two kernel variants); dt_bias bf16 [n_v]
//   z       [rows][z_stride]: in_proj_z output, v-head h at h*D
//   norm_w  [D] bf16, or f32 (norm_f32): output norm weight, multiplied as stored (NOT shifted)
//   state   [n_v][D (dv)][D (dk)]: S[h][i][j], row i (a dv index) contiguous over dk
//   out     [rows][n_v*D]: g = y * norm_w * silu(z), the gated norm without its factor
//   head_ss [rows][n_v][MQ_DELTA_HEAD_PARTIALS]: sums of y^2 over the MQ_DELTA_SCAN_ROWS
//           dv rows of each SIMD-group of a head: the head's factor is
//           rsqrt(sum / D + eps) (mq_delta::head_norm_inv, one summation order everywhere),
//           applied where out_proj loads g (qmv_head_norm) or in place (delta_norm_history)
// Rows belong to the step's segments (StepSegments, params/common.h): x, a, b, z and out
// are indexed by the step's row, while state, hist and state_snaps are per sequence slot,
// slot s at s * state_slot_stride, s * hist_slot_stride, s * snap_slot_stride floats
// (multiples of 4), and `position` below is the segment's.
// The ring is why neither a device-wide barrier nor a history snapshot is needed: a step
// at position pos reads positions pos-K+1 .. pos-1 (scan) and writes pos .. pos+rows-1.
// When rows <= hist_slots - (K-1) those are other ring slots than the ones read, so the
// scan itself stores them (store_history: decode and verify steps); longer prefill rows
// would wrap onto slots still being read, so delta_norm_history stores them after the scan.
// A verify step that keeps a of its rows continues at pos+a+1, reading positions this step
// wrote for its kept rows and older ones no step since has overwritten, as long as
// hist_slots >= K-1 + the largest rows of a verify step: the rows it rejected are simply
// rewritten later.
// State snapshots for speculative rollback: plane t (t < snap_rows, t < the segment's rows - 1)
// of a slot holds its state as it is AFTER the segment's row t, at t*state_snap_stride in the slot's planes. Strides are in
// floats, so the engine may interleave layers (plane stride = layers * plane size) and
// restore every layer with one delta_restore dispatch.
// All bindings 16-byte aligned; x_stride and z_stride multiples of 4 (float4 loads).

// delta_conv_scan_alog_{f32,bf16}[_wf32]: for each row t of a segment in turn, the causal
// depthwise conv + silu of the channels a SIMD-group needs, q/k L2 norms, the gates
//   decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b),
// the recurrent scan per v-head h (k-head h / (n_v / n_k)):
//   S *= decay; kv = S k; S += ((v - kv) * beta) outer k; y = S q,
// and out = y * norm_w * silu(z) with the SIMD-group's partial sum of y^2 into head_ss.
// Each SIMD-group owns MQ_DELTA_SCAN_ROWS dv rows of one head's state (in registers) and
// computes its own conv inputs, so SIMD-groups never wait for each other: dispatch
// threadgroups (ceil(n_v * D / MQ_DELTA_SCAN_ROWS / s), segments) of 32 * s threads, any s
// up to MQ_DELTA_SCAN_THREADS / 32 (its declared maximum: one head); grid y is the segment
// (segments are independent: each has its own slot's state, ring and snapshots).
// MQ_DELTA_SCAN_SIMDGROUPS is the engine's choice: small threadgroups spread 16 heads over
// 128 of them, enough for a 40-core GPU. With store_history it also writes the segment's
// rows of raw inputs into its ring (each channel by one SIMD-group).
#define MQ_DELTA_SCAN_ROWS 8
#define MQ_DELTA_SCAN_THREADS (32 * MQ_DELTA_HEAD_DIM / MQ_DELTA_SCAN_ROWS)
#define MQ_DELTA_SCAN_SIMDGROUPS 2
#define MQ_DELTA_HEAD_PARTIALS (MQ_DELTA_HEAD_DIM / MQ_DELTA_SCAN_ROWS)
struct DeltaScanParams {
  uint n_k;                // key heads
  uint n_v;                // value heads
  uint ksize;              // conv kernel size K >= 1
  uint hist_slots;         // ring slots of hist (>= K - 1)
  uint snap_rows;          // state snapshots after a segment's rows [0, min(snap_rows, rows - 1)); 0 = none
  uint store_history;      // 1: write the rows into the ring (every segment's rows <= hist_slots - (K - 1))
  uint x_stride;           // floats between rows of x (>= C, multiple of 4)
  uint ab_stride;          // floats between rows of a and of b (>= n_v)
  uint z_stride;           // floats between rows of z (>= n_v * D)
  uint ss_stride;          // floats between rows of head_ss (>= n_v * MQ_DELTA_HEAD_PARTIALS, multiple of 4)
  uint state_snap_stride;  // floats between state snapshot planes
  uint state_slot_stride;  // floats between slots' states (>= n_v * D * D)
  uint hist_slot_stride;   // floats between slots' history rings (>= hist_slots * C)
  uint snap_slot_stride;   // floats between slots' snapshot planes (>= snap_rows planes)
  uint norm_f32;           // 1: norm_w is f32, else bf16
  float qk_eps;            // inside the q/k L2 norms' sqrt (1e-6)
};

// delta_norm_history: what must wait for the whole scan in a prefill step, per segment
// (grid y). Threadgroups 0..n_v-1: the gated norm's factor of v-head h over the segment's
// rows, in place: out *= rsqrt(sum(head_ss) / D + eps). Threadgroups n_v + b, b < C / D:
// the raw inputs of channel block b for the segment's last min(rows, hist_slots) rows into
// its slot's history ring. Dispatch threadgroups (n_v + C / D, segments) of 32 * s threads,
// any s (SIMD-group g takes rows g, g + s, ...).
#define MQ_DELTA_NORM_SIMDGROUPS 4
struct DeltaNormParams {
  uint n_k;
  uint n_v;
  uint hist_slots;        // ring slots of hist
  uint x_stride;          // floats between rows of x
  uint ss_stride;         // floats between rows of head_ss
  uint hist_slot_stride;  // floats between slots' history rings (multiple of 4)
  float norm_eps;         // rms_norm_eps of the output norm
};

// delta_restore: state = state_snaps[plane] (rejecting the speculative rows after row
// `plane`), with `plane` read from a device word (the verify step's accepted-draft count)
// and nothing copied when it is >= planes. Each thread copies a float4: dispatch
// state_floats / 4 threads, any threadgroup size (state_floats a multiple of 4).
struct DeltaRestoreParams {
  uint state_floats;       // floats of state to copy (n_v * D * D, or all layers' states)
  uint state_snap_stride;  // floats between state snapshot planes
  uint planes;             // snapshot planes held: a plane >= planes keeps the live state
};
