// Parameters of shaders/attention.metal: gated full attention (Qwen3.5 style).
//
// The kernels are specialised for the head size and the rotary size below. The engine
// must check the model against them at load time (head_dim == MQ_ATTN_HEAD_DIM and
// head_dim * partial_rotary_factor == MQ_ATTN_ROT_DIM) and refuse other models.
#pragma once

#define MQ_ATTN_HEAD_DIM 256
#define MQ_ATTN_ROT_DIM 64
// q8 KV cache: one f16 scale per MQ_ATTN_Q8_BLOCK consecutive elements of a position row.
#define MQ_ATTN_Q8_BLOCK 32

// Buffers shared by the kernels (f32 unless stated; "elements" means floats):
//   q     [rows][q_stride]: head h at h * 2 * HEAD_DIM: [query(HEAD_DIM) | gate(HEAD_DIM)]
//   k     [rows][k_stride]: head h at h * HEAD_DIM
//   v     [rows][v_stride]: head h at h * HEAD_DIM
//   out   [rows][out_stride]: head h at h * HEAD_DIM (attention output, gated)
//   KV caches, one K and one V buffer per layer (bind at the layer's byte offset), with
//   kv_dim = nkv * HEAD_DIM elements per position:
//     q8:  int8 plane [max_ctx][kv_dim], then at byte offset max_ctx * kv_dim an f16
//          scale plane [max_ctx][kv_dim / Q8_BLOCK]; element = code * scale. Appending
//          stores d = f16(amax / 127) per block and code = clamp(rint(x / d), +-127) with
//          that stored d (d = 0 stores zero codes).
//     f16: half [max_ctx][kv_dim].
//   rope_turns [ROT_DIM / 2] uint64: rope_turns[i] = round(2^64 * theta^(-2i/ROT_DIM) / (2 pi))
//     (mod 2^64), computed once by the engine in double precision: the rotation of pair
//     i at position pos is (pos * rope_turns[i] mod 2^64) / 2^64 turns, exact in integer
//     arithmetic, so large positions lose no accuracy to float32 angle rounding.
// Row r of a step (of a segment, for attn_decode) is at position (cache row) pos_base + r; the
// cache holds positions < pos_base + rows once the step's K/V are appended, and row r attends
// to positions <= pos_base + r.
// Rotary positions (multimodal RoPE, Qwen3.5's interleaved M-RoPE) are three components
// (time, height, width) and need not be the cache row: text rows have all three equal to
// cache row + rope_delta (a per-sequence offset, 0 for text-only prompts, negative after
// images), image rows of a prefill chunk carry their own (rope_pos). Rotary pair i takes the
// height component when i % 3 == 1 and i < mrope_h_end, the width component when
// i % 3 == 2 and i < mrope_w_end, else time (mrope_h_end = 3 * mrope_section[1],
// mrope_w_end = 3 * mrope_section[2]; 0 and 0: every pair time).

// attn_qk_norm_rope_append_{q8,f16} (+ _wf32; prefill chunks): per-head RMSNorm of query
// and key (weights bf16 [HEAD_DIM], multiplied as stored), RoPE on the first ROT_DIM dims, in place in q and k;
// then K (normed, rotated) and V are appended to the cache at positions pos_base + r. Row r
// rotates at rope_pos[r] (int [rows][3], bound at buffer 9, read when has_rope_pos; bind any
// buffer otherwise), else at pos_base + r + rope_delta in every component.
// One SIMD-group per (row, slot), slots = nq query heads, nkv key heads, nkv value heads:
// dispatch ceil(rows * (nq + 2 nkv) / MQ_ATTN_PREP_SIMDGROUPS) threadgroups of
// MQ_ATTN_PREP_SIMDGROUPS * 32 threads.
#define MQ_ATTN_PREP_SIMDGROUPS 4
struct AttnPrepParams {
  uint rows;
  uint nq;        // query heads
  uint nkv;       // key/value heads; nq % nkv == 0
  uint q_stride;  // elements between rows of q (>= nq * 2 * HEAD_DIM)
  uint k_stride;  // elements between rows of k (>= nkv * HEAD_DIM)
  uint v_stride;  // elements between rows of v
  uint pos_base;  // position (= cache row) of row 0
  uint max_ctx;   // cache rows (places the q8 scale plane)
  float eps;      // RMSNorm epsilon
  int rope_delta;        // rotary position - cache row of text rows (no rope_pos)
  uint has_rope_pos;     // 1: rows rotate at rope_pos
  uint mrope_h_end;      // M-RoPE pairs below take height / width components (see above)
  uint mrope_w_end;
};

// Attention over the cache (decode, verify and prefill). Scale 1 / sqrt(HEAD_DIM); the
// kernels work in log2 units (scores times log2(e) / sqrt(HEAD_DIM), exp2), so partial
// maxima are log2-scaled too. out = softmax(q k^T / sqrt(HEAD_DIM)) v * sigmoid(gate).
//
// attn_decode_{q8,f16}_r{1,4} (+ _wf32) (flash-decode for decode and verify steps, 1..17
// rows in practice, any number works) does the step's whole attention prep itself, so a
// decode layer's attention is one dispatch (plus the combine when split), with no barrier
// between the append and the read. The step's rows belong to segments (StepSegments,
// params/common.h): segment i's rows are positions position_i .. of slot slot_i, whose K
// and V caches sit at byte offset slot_i * cache_slot_bytes of the bound buffers (each a
// cache of the layout above). Per segment:
//   - q, k, v are the projections as written (raw); each SIMD-group norms and rotates its
//     own query rows in registers (q stays raw in memory; its gate halves are read as is);
//   - positions < position_i come from the slot's cache; the segment's own positions
//     position_i + j are computed from its row j of k and v (norm, RoPE, then rounded
//     through the cache format: the very values a later read of the cache gives), and the
//     threadgroup whose split holds the position and whose row group holds row j, head
//     block 0, SIMD-group 0, appends them to the slot's cache. No other threadgroup of the
//     dispatch reads those rows (other segments read other slots).
//   - its context [0, position_i + rows_i) is cut into n_splits_i = ceil(context_i /
//     split_len[i]) splits of split_len[i] positions. A segment's split layout depends on
//     its own context only (never on the other segments), so its rows give the same bits
//     alone or batched.
// Each SIMD-group owns one query head; a threadgroup of S SIMD-groups
// (S = min(nq / nkv, MQ_ATTN_DECODE_MAX_SIMDGROUPS) is best; any S >= 1 within the
// pipeline's limit works) serves S of a kv head's nq / nkv query heads, so dispatch
// threadgroups (n_splits, nkv * ceil((nq / nkv) / S), sum_i ceil(rows_i / R)) of S * 32
// threads, n_splits = max_i n_splits_i, R = 1 or 4 from the kernel name (r1 for one row;
// r4 reads each K/V row once for up to 4 rows). Grid z enumerates the segments' row groups
// in segment order (a row group never straddles two segments); threadgroups whose split is
// past their segment's n_splits_i do nothing. A SIMD-group keeps MQ_ATTN_DECODE_KEYS
// positions in flight (their K and V loads issued before the dependent math) and updates
// the online softmax once per such block.
// The rows of a segment with n_splits_i == 1 get the gated output from the kernel itself
// (no combine); the others' rows get
//   part_o  [rows][nq][n_splits][HEAD_DIM] f32: unnormalised sum of p * v
//   part_ms [rows][nq][n_splits] float2: (max score in log2 units, sum of p)
// (splits < n_splits_i written) and attn_decode_combine (threadgroups (nq, rows) of any
// number of threads, MQ_ATTN_COMBINE_THREADS being one per 4 dims, after a barrier, needed
// when n_splits > 1) merges a row's own n_splits_i partials and applies the gate. Bind
// every buffer either way (part_* or out go unused). q_stride, k_stride, v_stride and
// out_stride must be multiples of 4 and q, k, v, out, part_o bound 16-byte aligned
// (float4 access); cache_slot_bytes a multiple of 16.
#define MQ_ATTN_DECODE_MAX_SIMDGROUPS 16
#define MQ_ATTN_DECODE_THREADS (MQ_ATTN_DECODE_MAX_SIMDGROUPS * 32)
#define MQ_ATTN_DECODE_KEYS 4
#define MQ_ATTN_COMBINE_THREADS (MQ_ATTN_HEAD_DIM / 4)
struct AttnDecodeParams {
  uint nq;                              // query heads
  uint nkv;                             // key/value heads; nq % nkv == 0
  uint q_stride;                        // elements between rows of q
  uint k_stride;                        // elements between rows of k
  uint v_stride;                        // elements between rows of v
  uint out_stride;                      // elements between rows of out
  uint max_ctx;                         // cache rows of a slot (places the q8 scale plane)
  uint cache_slot_bytes;                // bytes between slots' caches (>= one cache)
  uint n_splits;                        // splits of the dispatch: max over segments of n_splits_i
  uint split_len[MQ_MAX_SEGMENTS];      // per segment: positions per split (>= 1)
  float eps;                            // q/k RMSNorm epsilon
  int rope_delta[MQ_MAX_SEGMENTS];      // per segment: rotary position - cache row (its rows are text)
};
//
// attn_prefill_{q8,f16} (a chunk of rows after attn_qk_norm_rope_append, flash attention
// with 8x8 SIMD-group matrices):
// each SIMD-group owns 8 rows of one query head; a threadgroup of S SIMD-groups
// (1 <= S <= MQ_ATTN_PREFILL_MAX_SIMDGROUPS) owns one kv head and
//   S >= nq / nkv: all its nq / nkv query heads times RB = S / (nq / nkv) blocks of 8
//     rows (S a multiple of nq / nkv): dispatch (ceil(rows / (8 RB)), nkv) threadgroups;
//   S < nq / nkv: S of its query heads and 8 rows: dispatch
//     (ceil(rows / 8), nkv * ceil((nq / nkv) / S)) threadgroups;
// of S * 32 threads. q must be readable for ceil(rows / 8) * 8 rows (the rows past
// `rows` are read, never used).
#define MQ_ATTN_PREFILL_MAX_SIMDGROUPS 16
#define MQ_ATTN_PREFILL_THREADS (MQ_ATTN_PREFILL_MAX_SIMDGROUPS * 32)
struct AttnParams {
  uint rows;        // query rows in this step
  uint nq;          // query heads
  uint nkv;         // key/value heads; nq % nkv == 0
  uint q_stride;    // elements between rows of q
  uint out_stride;  // elements between rows of out
  uint pos_base;    // position of row 0
  uint max_ctx;     // cache rows (places the q8 scale plane)
};
