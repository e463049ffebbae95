// Parameters of shaders/quant.metal: MLX affine quantized projections and embedding gather.
//
// Kernels exist for bits 4 and 8 and group sizes 32, 64 and 128 (host names
// `<op>_b<bits>_g<group>`); the engine must check each quantized tensor against these
// at load time. Every kernel also needs in_dim (the quantized row length) to be a
// multiple of the group size, which makes it a multiple of 32: the kernels walk a row
// in 16-byte blocks (32 codes at 4 bits, 16 at 8 bits), and no block crosses a group.
// Buffers passed at an offset: weights, x and y at 16-byte alignment.
#pragma once

// qmv / qmv_rows (decode and verify matvecs): one threadgroup of
// MQ_QMV_SIMDGROUPS SIMD-groups owns MQ_QMV_SIMDGROUPS * MQ_QMV_ROWS_PER_SIMDGROUP
// consecutive output rows; dispatch ceil(out_dim / MQ_QMV_ROWS_PER_THREADGROUP)
// threadgroups of MQ_QMV_THREADS threads.
#define MQ_QMV_SIMDGROUPS 2
#define MQ_QMV_ROWS_PER_SIMDGROUP 4
#define MQ_QMV_ROWS_PER_THREADGROUP (MQ_QMV_SIMDGROUPS * MQ_QMV_ROWS_PER_SIMDGROUP)
#define MQ_QMV_THREADS (MQ_QMV_SIMDGROUPS * 32)
// qmv_rows takes 1..MQ_QMV_MAX_ROWS activation rows (the engine must not pass more).
#define MQ_QMV_MAX_ROWS 8

// qmm (prefill GEMM): a threadgroup of MQ_QMM_THREADS threads computes a tile of
// MQ_QMM_TILE_ROWS activation rows x MQ_QMM_TILE_OUT output columns, walking in_dim
// MQ_QMM_TILE_K at a time. Dispatch threadgroups
// (ceil(rows / MQ_QMM_TILE_ROWS), ceil(out_dim / MQ_QMM_TILE_OUT)).
#define MQ_QMM_TILE_ROWS 32
#define MQ_QMM_TILE_OUT 64
#define MQ_QMM_TILE_K 32
#define MQ_QMM_THREADS 128

// embed: dispatch threadgroups (ceil(dim / (MQ_EMBED_THREADS * 128 / bits)), rows) of
// MQ_EMBED_THREADS threads; each thread dequantizes one 16-byte block of a table row.
#define MQ_EMBED_THREADS 64

// y = W x for the rows of x. W is [out_dim][in_dim] quantized (MLX affine).
// qmv reads one x row and ignores rows and the strides; qmv_rows reads `rows`
// (1..MQ_QMV_MAX_ROWS) x rows; qmm reads any rows >= 1.
struct QuantMatmulParams {
  uint in_dim;    // K: multiple of the group size
  uint out_dim;   // N: any >= 1
  uint rows;      // M: activation rows
  uint x_stride;  // floats from one x row to the next (>= in_dim, multiple of 4)
  uint y_stride;  // floats from one y row to the next (>= out_dim)
};

// hidden[r][:] = dequantized table row ids[first + r], r < rows.
struct QuantEmbedParams {
  uint dim;    // table row length (hidden size): multiple of the group size
  uint vocab;  // table rows; an id >= vocab yields a row of NaN instead of a stray read
  uint first;  // index into ids of row 0
  uint rows;   // rows to gather
};
