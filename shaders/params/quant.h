// Parameters of shaders/quant.metal: projections and embedding gather for every weight
// format of shaders/quant_formats.h.
//
// Formats and host names `<op>_<format>` (op: qmv, qmv_rows, qmm, embed; in
// shaders/qmv_norm.metal qmv_norm, qmv_norm_rows, qmv_norm_silu, qmv_norm_silu_rows; in
// shaders/qmv_head_norm.metal qmv_head_norm, qmv_head_norm_rows):
//   b<bits>_g<group>  MLX affine, bits 2, 3, 4, 5, 6, 8, group 32, 64, 128: weight uint32
//                     [out][in*bits/32] (each row one little-endian bit stream, code 0 in the
//                     lowest bits; 3/5/6-bit codes straddle words), scales and biases bf16
//                     [out][in/group], w = scale * q + bias
//   b<bits>_g64_sf32  the same with float scales and biases (group 64 only)
//   mxfp4             E2M1 codes (8 per word), uint8 E8M0 scales [out][in/32], w = 2^(s-127) * v
//   nvfp4             E2M1 codes (8 per word), uint8 E4M3 scales [out][in/16], w = e4m3(s) * v
//   mxfp8             E4M3 codes (4 per word), uint8 E8M0 scales [out][in/32]
//   bf16, f16, f32    unquantized [out][in]; the scales/biases buffers are not read
// The engine must check each projection against these at load time. Every kernel needs
// in_dim (the row length) to be a multiple of MQ_QUANT_BLOCK (which every group size
// divides or is a multiple of): rows are walked in blocks of MQ_QUANT_BLOCK weights.
// Buffers passed at an offset: weights, x and y at 16-byte alignment.
#pragma once

// Every weight format, X(suffix, type...): the host-name suffix of its kernels and the
// quant_formats.h type they are instantiated with. The one list of formats: the .metal files
// instantiate every family over it, the engine names its kernels from it and Python's
// checkpoint checks read it (_core.weight_formats()). Affine with f32 scales exists for group
// 64 only (mlx-lm's default; each format costs compile time): checkpoints whose scales are
// f32, or f16 widened to f32 copies at load.
#define MQ_AFFINE_FORMATS(X, B) \
  X(b##B##_g32, affine<B, 32>) X(b##B##_g64, affine<B, 64>) X(b##B##_g128, affine<B, 128>) \
  X(b##B##_g64_sf32, affine<B, 64, float>)
#define MQ_WEIGHT_FORMATS(X)                                                                       \
  MQ_AFFINE_FORMATS(X, 2) MQ_AFFINE_FORMATS(X, 3) MQ_AFFINE_FORMATS(X, 4) MQ_AFFINE_FORMATS(X, 5) \
  MQ_AFFINE_FORMATS(X, 6) MQ_AFFINE_FORMATS(X, 8) X(mxfp4, mxfp4) X(nvfp4, nvfp4) X(mxfp8, mxfp8)  \
  X(bf16, dense<bfloat>) X(f16, dense<half>) X(f32, dense<float>)

// Weights per block: one lane-step of the matvecs, one K-step of the GEMM, one embed thread.
#define MQ_QUANT_BLOCK 32

// Decode and verify matvecs (qmv[_rows], qmv_norm[_rows], qmv_norm_silu[_rows]; moe_qmv): a
// threadgroup is MQ_QMV_SIMDGROUPS SIMD-groups (MQ_QMV_THREADS threads); each SIMD-group owns R
// consecutive weight rows, R = 2, 4 or 8 (host names <op>_r<R>_<format>), so a threadgroup
// owns MQ_QMV_SIMDGROUPS * R weight rows: dispatch ceil(out_dim / (MQ_QMV_SIMDGROUPS * R))
// threadgroups (qmv_norm_silu: R / 2 gate and R / 2 up rows per SIMD-group, so
// ceil(out_dim / (MQ_QMV_SIMDGROUPS * R / 2))). The result does not depend on R.
// Each lane keeps MQ_QMV_BLOCKS_IN_FLIGHT weight blocks in flight: R rows x
// MQ_QMV_BLOCKS_IN_FLIGHT / R of its consecutive steps (fewer on rows under that many steps).
// The engine picks R per projection (a norm-fused group: per group) at load, from the weight rows
// it streams and the GPU's core count: the largest R whose grid still gives every core
// MQ_QMV_THREADGROUPS_PER_CORE threadgroups, else 2. Larger R reuses each x block over more rows
// (x bytes read per weight byte fall as 1/R) and keeps more loads in flight on short rows,
// where a lane has fewer steps than MQ_QMV_BLOCKS_IN_FLIGHT / R; smaller R spreads a small
// matrix over every core.
#define MQ_QMV_SIMDGROUPS 2
#define MQ_QMV_THREADS (MQ_QMV_SIMDGROUPS * 32)
#define MQ_QMV_BLOCKS_IN_FLIGHT 8
#define MQ_QMV_THREADGROUPS_PER_CORE 4
// moe_qmv's fixed R: its grid already has a row of threadgroups per (token, expert) pair.
#define MQ_QMV_ROWS_PER_SIMDGROUP 4
#define MQ_QMV_ROWS_PER_THREADGROUP (MQ_QMV_SIMDGROUPS * MQ_QMV_ROWS_PER_SIMDGROUP)
// Verify matvecs (*_rows, *_deep) take their activation rows in two tiers, the row count M a
// template parameter: *_rows 1..MQ_QMV_SMALL_ROWS rows in the R = 2, 4, 8 variants, *_deep
// (host names <op>_deep_r<MQ_QMV_DEEP_R>_<format>) 1..MQ_QMV_MAX_ROWS rows (a DFlash block of
// 16 drafts + 1) in R = MQ_QMV_DEEP_R only. A lane keeps M * R accumulators: 64 at 8 x 8, 68 at
// 17 x 4 (17 x 8 = 136, twice the small tier's worst, risks spills), so steps of up to 8 rows never run a deep kernel and a
// deep step pays a grid of R = 4. The engine picks the tier by the step's rows; the walk order
// is the same in every tier and R, so a verify row keeps the bits of a decode row.
#define MQ_QMV_SMALL_ROWS 8
#define MQ_QMV_MAX_ROWS 17
#define MQ_QMV_DEEP_R 4

// qmv_norm[_rows] (qmv_norm.metal): the norm-fused matvec over a group of up to
// MQ_QMV_GROUP_MAX projections reading the same input, each member's rows in its own range of
// threadgroups (ceil(out_dim[m] / (MQ_QMV_SIMDGROUPS * R)) each), MQ_QMV_THREADS threads.
#define MQ_QMV_GROUP_MAX 4
// QmvNormParams::flags: ADD_MIX: h = x + mix (the residual add), else h = x; WRITE_H:
// threadgroup 0 writes h to x_out (a buffer other than x); WRITE_XN: threadgroup 0 writes
// xn = rms(h) * norm_w; NORM_F32: the norm weight is f32, else bf16.
#define MQ_QMV_ADD_MIX 1
#define MQ_QMV_WRITE_H 2
#define MQ_QMV_WRITE_XN 4
#define MQ_QMV_NORM_F32 8

// qmm (prefill GEMM): a threadgroup of MQ_QMM_THREADS threads computes a tile of
// MQ_QMM_TILE_ROWS activation rows x MQ_QMM_TILE_OUT output columns, walking in_dim
// MQ_QMM_TILE_K at a time. Dispatch threadgroups
// (ceil(rows / MQ_QMM_TILE_ROWS), ceil(out_dim / MQ_QMM_TILE_OUT)).
#define MQ_QMM_TILE_ROWS 32
#define MQ_QMM_TILE_OUT 64
#define MQ_QMM_TILE_K 32
#define MQ_QMM_THREADS 128

// embed: dispatch threadgroups (ceil(dim / (MQ_EMBED_THREADS * MQ_QUANT_BLOCK)), rows) of
// MQ_EMBED_THREADS threads; each thread dequantizes one block of a table row.
#define MQ_EMBED_THREADS 64

// y = W x for the rows of x. W is [out_dim][in_dim] in one of the formats above.
// qmv reads one x row and ignores rows and the strides; qmv_rows reads `rows`
// (1..MQ_QMV_SMALL_ROWS) x rows, qmv_deep 1..MQ_QMV_MAX_ROWS; qmm reads any rows >= 1.
struct QuantMatmulParams {
  uint in_dim;    // K: multiple of MQ_QUANT_BLOCK and of the group size
  uint out_dim;   // N: any >= 1
  uint rows;      // M: activation rows
  uint x_stride;  // floats from one x row to the next (>= in_dim, multiple of 4)
  uint y_stride;  // floats from one y row to the next (>= out_dim)
};

// Norm-fused matvecs (qmv_norm.metal) over activation rows r < rows (1 for the one-row
// kernels, 1..MQ_QMV_SMALL_ROWS for *_rows, 1..MQ_QMV_MAX_ROWS for *_deep): h[r] = x[r] (+ mix[r]), u[r] = h[r] *
// rsqrt(mean(h[r]^2) + eps) * norm_w, then y_m[r] = W_m u[r] for each member m (qmv_norm), or
// out[r] = silu(W_gate u[r]) * (W_up u[r]) (qmv_norm_silu: members 1, out is member 0).
// x, mix, x_out and xn are [rows][x_stride]; y_m is [rows][y_stride[m]].
struct QmvNormParams {
  uint in_dim;    // hidden size: multiple of MQ_QUANT_BLOCK and of the group size
  uint rows;      // activation rows
  uint x_stride;  // floats from one row of x / mix / x_out / xn to the next (multiple of 4)
  uint flags;     // MQ_QMV_ADD_MIX | MQ_QMV_WRITE_H | MQ_QMV_WRITE_XN | MQ_QMV_NORM_F32
  float eps;
  uint members;   // 1..MQ_QMV_GROUP_MAX
  uint out_dim[MQ_QMV_GROUP_MAX];   // rows of each member's W (any >= 1)
  uint y_stride[MQ_QMV_GROUP_MAX];  // floats from one y_m row to the next (>= out_dim[m])
  uint tg_end[MQ_QMV_GROUP_MAX];    // member m owns threadgroups [tg_end[m-1], tg_end[m]), tg_end[-1] = 0
};

// qmv_head_norm[_rows] (qmv_head_norm.metal): DeltaNet's out_proj with the gated output norm's
// per-head factor folded into its input load: y[r] = W (g[r] * f[r]), f[r] constant over each
// head of MQ_DELTA_HEAD_DIM inputs, from the head's MQ_DELTA_HEAD_PARTIALS sums of y^2 in
// head_ss (params/deltanet.h). g is [rows][x_stride], head_ss [rows][ss_stride], y
// [rows][y_stride]; grid, threadgroups and R variants as qmv[_rows].
struct QmvHeadNormParams {
  uint in_dim;     // n_v * MQ_DELTA_HEAD_DIM
  uint out_dim;    // rows of W (any >= 1)
  uint rows;       // activation rows: 1 (qmv_head_norm), 1..MQ_QMV_SMALL_ROWS (*_rows), ..MQ_QMV_MAX_ROWS (*_deep)
  uint x_stride;   // floats from one g row to the next (>= in_dim, multiple of 4)
  uint y_stride;   // floats from one y row to the next (>= out_dim)
  uint ss_stride;  // floats from one head_ss row to the next (multiple of 4)
  float eps;       // the output norm's rms_norm_eps
};

// hidden[r][:] = dequantized table row ids[first + r], r < rows.
struct QuantEmbedParams {
  uint dim;    // table row length (hidden size): multiple of MQ_QUANT_BLOCK and of the group size
  uint vocab;  // table rows; an id >= vocab yields a row of NaN instead of a stray read
  uint first;  // index into ids of row 0
  uint rows;   // rows to gather
};
