#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"
#include "quant_formats.h"

// Projections y = W x with f32 activations for every weight format of quant_formats.h
// (MLX affine 2..8-bit, mxfp4, nvfp4, mxfp8, and unquantized bf16/f16/f32): decode matvec,
// verify matvec over 1..MQ_QMV_MAX_ROWS rows, prefill GEMM, and embedding gather. Each kernel has one
// body templated on the format; host names are <op>_<format suffix> (instances.h, quant.metal).
//
// Buffers of every kernel: w [[buffer(0)]] (the format's words, row-major [out][...]),
// scales [[buffer(1)]] and biases [[buffer(2)]] (the format's, [out][in/GROUP]; not read by
// formats without them: bind anything), x/ids [[buffer(3)]], y [[buffer(4)]], params [[buffer(5)]].
// Rows are walked in blocks of MQ_QUANT_BLOCK weights (quant_formats.h).

// x[0 .. MQ_QUANT_BLOCK) into registers (8 float4s), returning its sum (the bias term of
// every affine row is bias * sum(x); other formats ignore it).
inline float load_x(device const float* x, thread float4* xv) {
  device const float4* x4 = (device const float4*)x;
  float4 sum = 0.0f;
  for (uint i = 0; i < QBLOCK / 4; i++) {
    xv[i] = x4[i];
    sum += xv[i];
  }
  return (sum.x + sum.y) + (sum.z + sum.w);
}

// ---------------------------------------------------------------------------------------
// The matvec block walk, shared by every matvec family (qmv, qmv_rows, moe_qmv, and the
// norm-fused kernels of qmv_norm.h).
// Each SIMD-group owns R weight rows (R a template parameter: the engine picks the variant per
// projection shape, params/quant.h); lane l takes blocks l, l+32, ... of every one of them (the
// whole SIMD-group streams 32 contiguous blocks of a row at a time), loads each weight block
// once and applies it to the M activation rows in order.
// Loads in flight: a lane issues the loads of U = MQ_QMV_BLOCKS_IN_FLIGHT / R of its
// consecutive steps (R x U blocks) before the math that needs them, so every variant keeps
// MQ_QMV_BLOCKS_IN_FLIGHT weight loads per lane in flight on rows of at least U lane-steps
// (32 U blocks) and R x (its steps) on shorter ones; the weight registers are the same for
// every R.
// Per (activation row, weight row): acc = Fmt::dot(block, x, acc) over the lane's blocks in
// increasing order, then simd_sum. Neither R nor U changes that order, and every family keeps
// it, so a verify row is bit-identical to the decode result for the same x whichever variants
// run them (with the same compiler settings).
// x is read from device memory by each SIMD-group, not staged in threadgroup memory: those reads
// hit the cache (one vector every threadgroup shares) and add no DRAM bytes, staging would only
// halve the cache requests of a threadgroup's two SIMD-groups, and the rows do not fit 32 KB
// (one 17408-wide row is 68 KB, 8 verify rows of 5120 are 160 KB, 17 are 340 KB): K-chunks would need two
// barriers each, draining the loads in flight. What cuts x reads per weight byte is R (an x block
// serves R rows). The byte count: shaders/README.md, "Decode and verify matvecs".

// One weight matrix of a projection: the format's words, scales and biases (quant_formats.h).
template <typename Fmt>
struct QuantWeights {
  device const uint* w;
  device const typename Fmt::scale_t* scales;
  device const typename Fmt::scale_t* biases;
};

// Activation rows as stored: row r at x + r * stride.
struct PlainRows {
  device const float* x;
  uint stride;
  // Block blk of row r into xv (8 float4s); returns its sum (see load_x).
  float load(uint r, uint blk, thread float4* xv) { return load_x(x + (ulong)r * stride + blk * QBLOCK, xv); }
};

// acc[r * R + i] += (weight row rows[i]) . (activation row r) over this lane's blocks, for
// r < nrows <= M. Rows i < SPLIT come from matrix a, the others from b (one matrix: SPLIT = R).
// X provides load(r, blk, xv) as PlainRows does.
template <typename Fmt, int M, int R, int SPLIT, typename X>
inline void qmv_walk(QuantWeights<Fmt> a, QuantWeights<Fmt> b, thread const ulong* rows, uint nblk, uint nrows,
                     uint lane, thread X& xs, thread float* acc) {
  constexpr int U = MQ_QMV_BLOCKS_IN_FLIGHT / R;
  static_assert(U >= 1 && U * R == MQ_QMV_BLOCKS_IN_FLIGHT, "R must divide MQ_QMV_BLOCKS_IN_FLIGHT");
  for (uint first = lane; first < nblk; first += 32 * U) {
    // Every load of the next U steps first (a lane's steps past the row's end load nothing)...
    typename Fmt::Block wb[U][R];
    for (int u = 0; u < U; u++) {
      const uint blk = first + 32 * u;
      if (blk >= nblk) break;  // lane-divergent: only at the row's end
      for (int i = 0; i < R; i++)
        wb[u][i] = i < SPLIT ? Fmt::load(a.w, a.scales, a.biases, rows[i], blk, nblk)
                             : Fmt::load(b.w, b.scales, b.biases, rows[i], blk, nblk);
    }
    // ... then the dots, step by step in block order.
    for (int u = 0; u < U; u++) {
      const uint blk = first + 32 * u;
      if (blk >= nblk) break;
      for (int r = 0; r < M; r++) {
        if ((uint)r >= nrows) break;  // uniform
        float4 xv[QBLOCK / 4];
        const float sum = xs.load(r, blk, xv);
        for (int i = 0; i < R; i++) acc[r * R + i] = Fmt::dot(wb[u][i], xv, sum, acc[r * R + i]);
      }
    }
  }
}

// The first of the R rows SIMD-group sg of threadgroup tg owns, and the rows the walk reads:
// rows past out_dim re-read the last row (never stored) so the walk stays branch-free.
inline uint qmv_first_row(uint tg, uint sg, uint rows_per_simdgroup) {
  return (tg * MQ_QMV_SIMDGROUPS + sg) * rows_per_simdgroup;
}
template <int R>
inline void qmv_clamped_rows(ulong row_base, uint row0, uint out_dim, thread ulong* rows) {
  for (int i = 0; i < R; i++) rows[i] = row_base + min(row0 + i, out_dim - 1);
}

// ---------------------------------------------------------------------------------------
// The matvec kernels' common body: y[r][row] = (weight row row_base + row) . (activation row
// r of xs) for this SIMD-group's R rows < out_dim and r < nrows <= M; y rows y_stride apart.
template <typename Fmt, int M, int R, typename X>
inline void qmv_rows_body(QuantWeights<Fmt> m, thread X& xs, device float* y, uint y_stride, uint in_dim,
                          uint out_dim, ulong row_base, uint nrows, uint tg, uint sg, uint lane) {
  const uint row0 = qmv_first_row(tg, sg, R);
  if (row0 >= out_dim) return;  // uniform over the SIMD-group
  ulong rows[R];
  qmv_clamped_rows<R>(row_base, row0, out_dim, rows);
  float acc[M * R];
  for (int i = 0; i < M * R; i++) acc[i] = 0.0f;
  qmv_walk<Fmt, M, R, R>(m, m, rows, in_dim / QBLOCK, nrows, lane, xs, acc);
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    for (int i = 0; i < R; i++) {
      const float sum = simd_sum(acc[r * R + i]);
      if (lane == 0 && row0 + i < out_dim) y[(ulong)r * y_stride + row0 + i] = sum;
    }
  }
}

// Decode matvec: y = W x for one activation row.
// The body of qmv over rows row_base .. row_base + out_dim of w (a stack of matrices, e.g.
// MoE experts [experts][out_dim][..], is addressed by its first row); y gets out_dim values.
// moe_qmv uses the default R (its grid already has a threadgroup row per (token, expert) pair).
template <typename Fmt, int R = MQ_QMV_ROWS_PER_SIMDGROUP>
inline void qmv_body(device const uint* w, device const typename Fmt::scale_t* scales,
                     device const typename Fmt::scale_t* biases, device const float* x, device float* y,
                     uint in_dim, uint out_dim, ulong row_base, uint tg, uint sg, uint lane) {
  PlainRows xs{x, 0};
  qmv_rows_body<Fmt, 1, R>(QuantWeights<Fmt>{w, scales, biases}, xs, y, 0, in_dim, out_dim, row_base, 1, tg, sg,
                           lane);
}

template <typename Fmt, int R>
[[kernel]] void qmv(
    device const uint* w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],                        // [in_dim]
    device float* y [[buffer(4)]],                              // [out_dim]
    constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  qmv_body<Fmt, R>(w, scales, biases, x, y, p.in_dim, p.out_dim, 0, tg, sg, lane);
}

// ---------------------------------------------------------------------------------------
// Verify matvec: y[r] = W x[r] for r < p.rows (1..M) with ONE weight stream: each weight
// block is loaded once and applied to every x row (qmv_walk). M: MQ_QMV_SMALL_ROWS (qmv_rows)
// or MQ_QMV_MAX_ROWS (qmv_deep, R = MQ_QMV_DEEP_R: params/quant.h gives the register count).
template <typename Fmt, int M, int R>
[[kernel]] void qmv_rows(
    device const uint* w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],                        // [rows][x_stride], first in_dim used
    device float* y [[buffer(4)]],                              // [rows][y_stride], first out_dim written
    constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  PlainRows xs{x, p.x_stride};
  qmv_rows_body<Fmt, M, R>(QuantWeights<Fmt>{w, scales, biases}, xs, y, p.y_stride, p.in_dim, p.out_dim, 0,
                           min(p.rows, (uint)M), tg, sg, lane);
}

// ---------------------------------------------------------------------------------------
// Prefill GEMM: Y[rows][out] = X[rows][in] W^T with f32 simdgroup-matrix tiles.
// A threadgroup (4 SIMD-groups) computes a 32-row x 64-column tile of Y; per K-step of one
// block (32) SIMD-groups 0-1 dequantize a 64 x 32 weight tile into threadgroup memory (f32,
// exactly Fmt::dequant: one weight row's block per thread) while SIMD-groups 2-3 copy a
// 32 x 32 tile of X (16 floats per thread). SIMD-group sg owns rows 16*(sg/2) .. +16 and
// columns 32*(sg%2) .. +32 (2 x 4 accumulators of 8x8). The next K-step's device loads are
// issued before the current tile's multiplies to overlap them.
// Edges: X rows and W rows past the end are clamped re-reads of the last one (never a read
// past a buffer), and partial tiles are stored through threadgroup memory with guards.
constant constexpr uint QMM_LD = MQ_QMM_TILE_K + 4;  // padded row stride of the K tiles
constant constexpr uint QMM_LDC = MQ_QMM_TILE_OUT + 4;

// One thread's device loads of the K-step at block k: a weight row's block (threads < BN)
// or 16 floats of an x row (the others; xsrc already holds the row and lane offset).
template <typename Fmt>
inline void qmm_fetch(bool weights, device const uint* w, device const typename Fmt::scale_t* scales,
                      device const typename Fmt::scale_t* biases, ulong wrow, uint nblk,
                      device const float* xsrc, uint k, thread typename Fmt::Block& wreg, thread float4* xreg) {
  if (weights) {
    wreg = Fmt::load(w, scales, biases, wrow, k, nblk);
  } else {
    device const float4* src = (device const float4*)(xsrc + k * QBLOCK);
    for (uint i = 0; i < 4; i++) xreg[i] = src[i];
  }
}

// Tile memory of qmm: the X tile [BM][QMM_LD], then the W tile [BN][QMM_LD]; reused as the
// C tile [BM][QMM_LDC] for edge stores. float4 for the 16-byte alignment of the staging stores.
constant constexpr uint QMM_SMEM_FLOAT4S = (MQ_QMM_TILE_ROWS + MQ_QMM_TILE_OUT) * QMM_LD / 4;

// The body of qmm for tile tg over rows row_base .. row_base + p.out_dim of w (a stack of
// matrices is addressed by its first row, as in qmv_body); `smem` is the kernel's tile memory.
template <typename Fmt>
inline void qmm_tile(device const uint* w, device const typename Fmt::scale_t* scales,
                     device const typename Fmt::scale_t* biases, device const float* x, device float* y,
                     thread const QuantMatmulParams& p, ulong row_base, threadgroup float4* smem, uint2 tg,
                     uint tid, uint sg) {
  constexpr uint BM = MQ_QMM_TILE_ROWS, BN = MQ_QMM_TILE_OUT, BK = MQ_QMM_TILE_K;
  static_assert(MQ_QMM_THREADS == 128 && BM == 32 && BN == 64 && BK == QBLOCK,
                "qmm's thread-to-tile mapping assumes 128 threads, 32 x 64 tiles, K-step of one block");
  static_assert(BM * QMM_LDC <= (BM + BN) * QMM_LD, "the C tile must fit in the K tiles' memory");
  threadgroup float* xs = (threadgroup float*)smem;
  threadgroup float* ws = xs + BM * QMM_LD;

  const uint m0 = tg.x * BM;
  const uint n0 = tg.y * BN;
  const uint nblk = p.in_dim / QBLOCK;

  // Threads 0..BN-1 (SIMD-groups 0, 1: uniform) stage weight row tid of the tile; the
  // others copy x: thread BN + t stages elements 16*(t%2) .. +16 of tile row t/2.
  const bool stages_weights = tid < BN;
  const ulong wrow = row_base + min(n0 + tid, p.out_dim - 1);
  const uint xm = tid % BN / 2;
  const uint xk = 16 * (tid % 2);
  device const float* xsrc = x + (ulong)min(m0 + xm, p.rows - 1) * p.x_stride + xk;

  typename Fmt::Block wreg;
  float4 xreg[4];

  const uint sm = 16 * (sg / 2);
  const uint sn = 32 * (sg % 2);
  simdgroup_float8x8 acc[2][4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = make_filled_simdgroup_matrix<float, 8>(0.0f);

  qmm_fetch<Fmt>(stages_weights, w, scales, biases, wrow, nblk, xsrc, 0, wreg, xreg);
  for (uint k = 0; k < nblk; k++) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // previous tiles fully consumed
    if (stages_weights) {
      float v[QBLOCK];
      Fmt::dequant(wreg, v);
      threadgroup float4* dst = (threadgroup float4*)(ws + tid * QMM_LD);
      for (uint i = 0; i < QBLOCK / 4; i++) dst[i] = float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else {
      threadgroup float4* dst = (threadgroup float4*)(xs + xm * QMM_LD + xk);
      for (uint i = 0; i < 4; i++) dst[i] = xreg[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (k + 1 < nblk)  // uniform
      qmm_fetch<Fmt>(stages_weights, w, scales, biases, wrow, nblk, xsrc, k + 1, wreg, xreg);
    for (uint kk = 0; kk < BK; kk += 8) {
      simdgroup_float8x8 a[2], b[4];
      for (int i = 0; i < 2; i++) simdgroup_load(a[i], xs + (sm + 8 * i) * QMM_LD + kk, QMM_LD);
      for (int j = 0; j < 4; j++)
        simdgroup_load(b[j], ws + (sn + 8 * j) * QMM_LD + kk, QMM_LD, ulong2(0, 0), true);
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }

  if (m0 + BM <= p.rows && n0 + BN <= p.out_dim) {  // uniform: interior tile
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 4; j++)
        simdgroup_store(acc[i][j], y + (ulong)(m0 + sm + 8 * i) * p.y_stride + n0 + sn + 8 * j,
                        p.y_stride);
    return;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);  // tiles fully consumed before reuse
  threadgroup float* cs = xs;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      simdgroup_store(acc[i][j], cs + (sm + 8 * i) * QMM_LDC + sn + 8 * j, QMM_LDC);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < BM * BN; e += MQ_QMM_THREADS) {
    const uint m = e / BN, n = e % BN;
    if (m0 + m < p.rows && n0 + n < p.out_dim)
      y[(ulong)(m0 + m) * p.y_stride + n0 + n] = cs[m * QMM_LDC + n];
  }
}


template <typename Fmt>
[[kernel]] void qmm(
    device const uint* w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],                        // [rows][x_stride], first in_dim used
    device float* y [[buffer(4)]],                              // [rows][y_stride], first out_dim written
    constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float4 smem[QMM_SMEM_FLOAT4S];
  // Field by field: a whole-struct copy out of the constant address space is not portable MSL.
  const QuantMatmulParams params{p.in_dim, p.out_dim, p.rows, p.x_stride, p.y_stride};
  qmm_tile<Fmt>(w, scales, biases, x, y, params, 0, smem, tg, tid, sg);
}

// ---------------------------------------------------------------------------------------
// Embedding gather: hidden[r][:] = dequantized table row ids[first + r], each value exactly
// Fmt::dequant. Thread (gid.x, gid.y) writes block gid.x (MQ_QUANT_BLOCK values) of row gid.y.
template <typename Fmt>
[[kernel]] void embed(
    device const uint* w [[buffer(0)]],                         // [vocab][dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [vocab][dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [vocab][dim/GROUP]
    device const uint* ids [[buffer(3)]],                       // token ids; rows first .. first+rows used
    device float* hidden [[buffer(4)]],                         // [rows][dim]
    constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]) {
  const uint nblk = p.dim / QBLOCK;
  if (gid.x >= nblk || gid.y >= p.rows) return;
  device float4* dst = (device float4*)(hidden + (ulong)gid.y * p.dim + gid.x * QBLOCK);
  const uint id = ids[p.first + gid.y];
  if (id >= p.vocab) {  // a bad id poisons its row instead of reading outside the table
    for (uint i = 0; i < QBLOCK / 4; i++) dst[i] = float4(NAN);
    return;
  }
  float v[QBLOCK];
  Fmt::dequant(Fmt::load(w, scales, biases, id, gid.x, nblk), v);
  for (uint i = 0; i < QBLOCK / 4; i++) dst[i] = float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
