// Parameters of shaders/dflash.metal: the DFlash drafter's own kernels (issue 28; the math in
// csrc/engine/dflash.h). Its projections, norms and activation are quant.metal's and norm.metal's.
#pragma once

// dflash_qk_norm_rope, dflash_attention: one SIMD-group per (head, row); a lane holds head dims
// lane + 32 j, so head_dim is a multiple of 64 (each lane holds both halves of its RoPE pairs)
// up to MQ_DFLASH_MAX_HEAD_DIM.
#define MQ_DFLASH_MAX_HEAD_DIM 256
#define MQ_DFLASH_THREADS 32

// out[r][col0 + c] = x[r][c] + mix[r][c], c < dim: the target's residual stream after a layer
// (its input x plus its MLP output mix), captured for the drafter. x, mix [rows][dim];
// out [rows][out_stride]. Grid of threads (dim, rows).
struct DflashCaptureParams {
  uint dim;
  uint rows;
  uint out_stride;
  uint col0;
};

// Row r of the pass is position seg.position + (r - seg.first_row) of slot seg.slot for the
// segment holding it (StepSegments, bound beside). Heads u < nq: q row r head u =
// rope(rms(q) * q_norm) in place. Heads nq <= u < nq + nkv: kv head h = u - nq:
// k_cache[slot][pos][h] = rope(rms(k) * k_norm), v_cache[slot][pos][h] = v. RoPE split-half over
// the whole head: pair (i, i + head_dim / 2) turns by pos * theta^(-2i / head_dim).
// Caches f32 [slots][context rows][nkv * head_dim], slot_floats apart. Grid (nq + nkv, rows)
// threadgroups of 32.
struct DflashPrepParams {
  uint nq;
  uint nkv;
  uint head_dim;
  uint q_stride;   // floats between q rows
  uint kv_stride;  // floats between k (and v) rows
  uint slot_floats;  // floats between two slots' parts of a cache
  float eps;
  float log2_theta;
};

// out[r][h] = softmax_j(q[r][h] . k[j][h / (nq / nkv)] * scale) v[j][..], j < n_keys, no mask
// (the drafter's block attends to its context and to the whole block). k, v: one slot's cache
// rows [n_keys][nkv * head_dim]. Grid (nq, rows) threadgroups of 32.
struct DflashAttentionParams {
  uint nq;
  uint nkv;
  uint head_dim;
  uint n_keys;
  uint q_stride;
  uint out_stride;
  float scale;
};
