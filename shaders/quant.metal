#include <metal_stdlib>
using namespace metal;
#include "params.h"

// MLX affine quantized projections (w = scale * q + bias per group) with f32 activations:
// decode matvec, verify matvec over 1..8 rows, prefill GEMM, and embedding gather.
//
// Weight layout shared by every kernel (BITS in {4, 8}, GROUP in {32, 64, 128}):
//   w       [out][in*BITS/32] uint32, code j of a word in bits BITS*j .. (code 0 lowest)
//   scales  [out][in/GROUP] bf16
//   biases  [out][in/GROUP] bf16
// The matvecs walk a row in 16-byte blocks of 128/BITS codes; a block never crosses a
// group (GROUP >= 32 >= 128/BITS and both are powers of two), so it has one scale/bias.

// x[0 .. 128/BITS) into registers in the order qdot_block consumes it, returning its sum
// (the bias term of every row is bias * sum(x)). At 4 bits xa[j]/xb[j] hold the even/odd
// elements of word j, matching the byte-wise nibble split; at 8 bits xa[j] = x[4j .. 4j+4).
template <int BITS>
inline float qload_x(device const float* x, thread float4* xa, thread float4* xb) {
  device const float4* x4 = (device const float4*)x;
  float4 sum = 0.0f;
  if (BITS == 4) {
    for (int j = 0; j < 4; j++) {
      const float4 lo = x4[2 * j];
      const float4 hi = x4[2 * j + 1];
      xa[j] = float4(lo.x, lo.z, hi.x, hi.z);
      xb[j] = float4(lo.y, lo.w, hi.y, hi.w);
      sum += lo + hi;
    }
  } else {
    for (int j = 0; j < 4; j++) {
      xa[j] = x4[j];
      sum += xa[j];
    }
  }
  return (sum.x + sum.y) + (sum.z + sum.w);
}

// sum_j q_j x_j over one 16-byte block: codes are exact small integers in float, so the
// only rounding is the f32 fma chain (fixed order: word 0..3, low codes before high).
template <int BITS>
inline float qdot_block(uint4 w, thread const float4* xa, thread const float4* xb) {
  float4 acc = 0.0f;
  for (int j = 0; j < 4; j++) {
    const uint word = w[j];
    if (BITS == 4) {
      acc = fma(float4(as_type<uchar4>(word & 0x0F0F0F0Fu)), xa[j], acc);
      acc = fma(float4(as_type<uchar4>((word >> 4) & 0x0F0F0F0Fu)), xb[j], acc);
    } else {
      acc = fma(float4(as_type<uchar4>(word)), xa[j], acc);
    }
  }
  return (acc.x + acc.y) + (acc.z + acc.w);
}

// ---------------------------------------------------------------------------------------
// Decode matvec: y = W x for one activation row.
// Each SIMD-group owns MQ_QMV_ROWS_PER_SIMDGROUP output rows; lane l takes blocks
// l, l+32, ... of every one of them (a uint4 per row per step: the whole SIMD-group
// streams 512 contiguous bytes of a row at a time), loading its x block once for all rows.
// Per row: acc = fma(s, sum q x, fma(b, sum x, acc)) over the lane's blocks in order, then
// simd_sum. qmv_rows repeats exactly this order per row, so a verify row is bit-identical
// to the decode result for the same x (with the same compiler settings).
// qmv_body is the whole kernel over explicit pointers: moe.metal's gathered expert matvec
// calls it on one expert's slice of a stacked [experts][out][in] weight.
template <int BITS, int GROUP>
inline void qmv_body(device const uint* w, device const bfloat* scales, device const bfloat* biases,
                     device const float* x, device float* y, uint in_dim, uint out_dim, uint tg, uint sg,
                     uint lane) {
  constexpr uint QB = 128 / BITS;  // codes per 16-byte block
  constexpr int R = MQ_QMV_ROWS_PER_SIMDGROUP;
  const uint row0 = (tg * MQ_QMV_SIMDGROUPS + sg) * R;
  if (row0 >= out_dim) return;  // uniform over the SIMD-group
  const uint nblk = in_dim / QB;
  const uint gpr = in_dim / GROUP;

  // Rows past out_dim re-read the last row (never stored) so the loop stays branch-free.
  ulong roff[R];
  for (int i = 0; i < R; i++) roff[i] = (ulong)min(row0 + i, out_dim - 1);
  device const uint4* w4 = (device const uint4*)w;

  float acc[R];
  for (int i = 0; i < R; i++) acc[i] = 0.0f;
  for (uint blk = lane; blk < nblk; blk += 32) {
    float4 xa[4], xb[4];
    const float xs = qload_x<BITS>(x + blk * QB, xa, xb);
    const uint g = blk * QB / GROUP;
    uint4 wq[R];
    for (int i = 0; i < R; i++) wq[i] = w4[roff[i] * nblk + blk];
    for (int i = 0; i < R; i++) {
      const float s = float(scales[roff[i] * gpr + g]);
      const float b = float(biases[roff[i] * gpr + g]);
      acc[i] = fma(s, qdot_block<BITS>(wq[i], xa, xb), fma(b, xs, acc[i]));
    }
  }
  for (int i = 0; i < R; i++) {
    const float sum = simd_sum(acc[i]);
    if (lane == 0 && row0 + i < out_dim) y[row0 + i] = sum;
  }
}

template <int BITS, int GROUP>
[[kernel]] void qmv(
    device const uint* w [[buffer(0)]],         // [out_dim][in_dim*BITS/32]
    device const bfloat* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const bfloat* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],        // [in_dim]
    device float* y [[buffer(4)]],              // [out_dim]
    constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  qmv_body<BITS, GROUP>(w, scales, biases, x, y, p.in_dim, p.out_dim, tg, sg, lane);
}

// ---------------------------------------------------------------------------------------
// Verify matvec: y[r] = W x[r] for r < p.rows (1..MQ_QMV_MAX_ROWS) with ONE weight
// stream: each weight block is loaded once and applied to every x row. Same geometry,
// block walk and per-row reduction order as qmv (see there).
template <int BITS, int GROUP>
[[kernel]] void qmv_rows(
    device const uint* w [[buffer(0)]],         // [out_dim][in_dim*BITS/32]
    device const bfloat* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const bfloat* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],        // [rows][x_stride], first in_dim used
    device float* y [[buffer(4)]],              // [rows][y_stride], first out_dim written
    constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint QB = 128 / BITS;  // codes per 16-byte block
  constexpr int R = MQ_QMV_ROWS_PER_SIMDGROUP;
  constexpr int M = MQ_QMV_MAX_ROWS;
  const uint row0 = (tg * MQ_QMV_SIMDGROUPS + sg) * R;
  if (row0 >= p.out_dim) return;  // uniform over the SIMD-group
  const uint nblk = p.in_dim / QB;
  const uint gpr = p.in_dim / GROUP;
  const uint nrows = min(p.rows, (uint)M);

  ulong roff[R];
  for (int i = 0; i < R; i++) roff[i] = (ulong)min(row0 + i, p.out_dim - 1);
  device const uint4* w4 = (device const uint4*)w;

  float acc[M][R];
  for (int r = 0; r < M; r++)
    for (int i = 0; i < R; i++) acc[r][i] = 0.0f;
  for (uint blk = lane; blk < nblk; blk += 32) {
    const uint g = blk * QB / GROUP;
    uint4 wq[R];
    float s[R], b[R];
    for (int i = 0; i < R; i++) wq[i] = w4[roff[i] * nblk + blk];
    for (int i = 0; i < R; i++) {
      s[i] = float(scales[roff[i] * gpr + g]);
      b[i] = float(biases[roff[i] * gpr + g]);
    }
    for (int r = 0; r < M; r++) {
      if ((uint)r >= nrows) break;  // uniform
      float4 xa[4], xb[4];
      const float xs = qload_x<BITS>(x + (ulong)r * p.x_stride + blk * QB, xa, xb);
      for (int i = 0; i < R; i++) {
        acc[r][i] = fma(s[i], qdot_block<BITS>(wq[i], xa, xb), fma(b[i], xs, acc[r][i]));
      }
    }
  }
  for (int r = 0; r < M; r++) {
    if ((uint)r >= nrows) break;  // uniform
    for (int i = 0; i < R; i++) {
      const float sum = simd_sum(acc[r][i]);
      if (lane == 0 && row0 + i < p.out_dim) y[(ulong)r * p.y_stride + row0 + i] = sum;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Prefill GEMM: Y[rows][out] = X[rows][in] W^T with f32 simdgroup-matrix tiles.
// A threadgroup (4 SIMD-groups) computes a 32-row x 64-column tile of Y; per K-step of 32
// it dequantizes a 64 x 32 weight tile into threadgroup memory (f32, exactly
// fma(scale, q, bias)) next to a 32 x 32 tile of X. SIMD-group sg owns rows
// 16*(sg/2) .. +16 and columns 32*(sg%2) .. +32 (2 x 4 accumulators of 8x8). The next
// K-step's device loads are issued before the current tile's multiplies to overlap them.
// Edges: X rows and W rows past the end are clamped re-reads of the last one (never a read
// past a buffer), and partial tiles are stored through threadgroup memory with guards.
constant constexpr uint QMM_LD = MQ_QMM_TILE_K + 4;  // padded row stride of the K tiles
constant constexpr uint QMM_LDC = MQ_QMM_TILE_OUT + 4;

// Device loads of one K-step for one thread: its 16 codes (+ scale, bias) of a weight row
// at k0 + wk, and 8 floats of an x row at k0 (the pointers already hold row and lane offsets).
template <int BITS, int GROUP>
inline void qmm_fetch(device const uint* wsrc, device const bfloat* ssrc, device const bfloat* bsrc,
                      device const float* xsrc, uint k0, uint wk, thread uint* wreg,
                      thread float& sreg, thread float& breg, thread float4* xreg) {
  device const uint* src = wsrc + k0 * BITS / 32;
  if (BITS == 4) {
    const uint2 v = *(device const uint2*)src;
    wreg[0] = v.x;
    wreg[1] = v.y;
  } else {
    const uint4 v = *(device const uint4*)src;
    for (uint j = 0; j < 16 * BITS / 32; j++) wreg[j] = v[j];
  }
  sreg = float(ssrc[(k0 + wk) / GROUP]);
  breg = float(bsrc[(k0 + wk) / GROUP]);
  xreg[0] = *(device const float4*)(xsrc + k0);
  xreg[1] = *(device const float4*)(xsrc + k0 + 4);
}

// Tile memory of one qmm threadgroup: X tile [BM][QMM_LD], then W tile [BN][QMM_LD];
// reused as the C tile [BM][QMM_LDC] for edge stores. float4 for the 16-byte alignment of
// the float4 staging stores. The kernel declares it (threadgroup memory lives in kernels).
constant constexpr uint QMM_SMEM_FLOAT4S = (MQ_QMM_TILE_ROWS + MQ_QMM_TILE_OUT) * QMM_LD / 4;

// qmm_tile is the whole kernel over explicit pointers and sizes: moe.metal's grouped GEMM
// calls it on one expert's slice of a stacked weight and that expert's rows.
template <int BITS, int GROUP>
inline void qmm_tile(device const uint* w, device const bfloat* scales, device const bfloat* biases,
                     device const float* x, device float* y, thread const QuantMatmulParams& p,
                     threadgroup float4* smem, uint2 tg, uint tid, uint sg) {
  constexpr uint BM = MQ_QMM_TILE_ROWS, BN = MQ_QMM_TILE_OUT, BK = MQ_QMM_TILE_K;
  static_assert(MQ_QMM_THREADS == 128 && BM == 32 && BN == 64 && BK == 32,
                "qmm's thread-to-tile mapping assumes 128 threads, 32 x 64 tiles, K-step 32");
  static_assert(BM * QMM_LDC <= (BM + BN) * QMM_LD, "the C tile must fit in the K tiles' memory");
  constexpr uint WORDS = 16 * BITS / 32;  // words of the 16 codes a thread dequantizes
  threadgroup float* xs = (threadgroup float*)smem;
  threadgroup float* ws = xs + BM * QMM_LD;

  const uint m0 = tg.x * BM;
  const uint n0 = tg.y * BN;
  const uint wpr = p.in_dim * BITS / 32;
  const uint gpr = p.in_dim / GROUP;

  // Weight staging: thread t dequantizes codes 16*(t%2) .. +16 of tile row t/2.
  const uint wn = tid / 2;
  const uint wk = 16 * (tid % 2);
  const ulong wrow = (ulong)min(n0 + wn, p.out_dim - 1);
  device const uint* wsrc = w + wrow * wpr + wk * BITS / 32;
  device const bfloat* ssrc = scales + wrow * gpr;
  device const bfloat* bsrc = biases + wrow * gpr;
  // X staging: thread t copies elements 8*(t%4) .. +8 of tile row t/4.
  const uint xm = tid / 4;
  const uint xk = 8 * (tid % 4);
  device const float* xsrc = x + (ulong)min(m0 + xm, p.rows - 1) * p.x_stride + xk;

  uint wreg[WORDS];
  float sreg, breg;
  float4 xreg[2];

  const uint sm = 16 * (sg / 2);
  const uint sn = 32 * (sg % 2);
  simdgroup_float8x8 acc[2][4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = make_filled_simdgroup_matrix<float, 8>(0.0f);

  qmm_fetch<BITS, GROUP>(wsrc, ssrc, bsrc, xsrc, 0, wk, wreg, sreg, breg, xreg);
  for (uint k0 = 0; k0 < p.in_dim; k0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // previous tiles fully consumed
    {
      const float4 s4 = sreg, b4 = breg;
      threadgroup float4* dst = (threadgroup float4*)(ws + wn * QMM_LD + wk);
      if (BITS == 4) {
        for (uint j = 0; j < WORDS; j++) {
          const float4 lo = float4(as_type<uchar4>(wreg[j] & 0x0F0F0F0Fu));         // codes 0,2,4,6
          const float4 hi = float4(as_type<uchar4>((wreg[j] >> 4) & 0x0F0F0F0Fu));  // codes 1,3,5,7
          dst[2 * j] = fma(s4, float4(lo.x, hi.x, lo.y, hi.y), b4);
          dst[2 * j + 1] = fma(s4, float4(lo.z, hi.z, lo.w, hi.w), b4);
        }
      } else {
        for (uint j = 0; j < WORDS; j++) dst[j] = fma(s4, float4(as_type<uchar4>(wreg[j])), b4);
      }
      threadgroup float4* xdst = (threadgroup float4*)(xs + xm * QMM_LD + xk);
      xdst[0] = xreg[0];
      xdst[1] = xreg[1];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (k0 + BK < p.in_dim)  // uniform
      qmm_fetch<BITS, GROUP>(wsrc, ssrc, bsrc, xsrc, k0 + BK, wk, wreg, sreg, breg, xreg);
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

template <int BITS, int GROUP>
[[kernel]] void qmm(
    device const uint* w [[buffer(0)]],         // [out_dim][in_dim*BITS/32]
    device const bfloat* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const bfloat* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* x [[buffer(3)]],        // [rows][x_stride], first in_dim used
    device float* y [[buffer(4)]],              // [rows][y_stride], first out_dim written
    constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float4 smem[QMM_SMEM_FLOAT4S];
  const QuantMatmulParams tp{p.in_dim, p.out_dim, p.rows, p.x_stride, p.y_stride};  // thread copy for qmm_tile
  qmm_tile<BITS, GROUP>(w, scales, biases, x, y, tp, smem, tg, tid, sg);
}

// ---------------------------------------------------------------------------------------
// Embedding gather: hidden[r][:] = dequantized table row ids[first + r], each value exactly
// fma(scale, q, bias). Thread (gid.x, gid.y) writes block gid.x (128/BITS values) of row gid.y.
template <int BITS, int GROUP>
[[kernel]] void embed(
    device const uint* w [[buffer(0)]],         // [vocab][dim*BITS/32]
    device const bfloat* scales [[buffer(1)]],  // [vocab][dim/GROUP]
    device const bfloat* biases [[buffer(2)]],  // [vocab][dim/GROUP]
    device const uint* ids [[buffer(3)]],       // token ids; rows first .. first+rows used
    device float* hidden [[buffer(4)]],         // [rows][dim]
    constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]) {
  constexpr uint QB = 128 / BITS;  // codes per 16-byte block
  const uint nblk = p.dim / QB;
  if (gid.x >= nblk || gid.y >= p.rows) return;
  device float4* dst = (device float4*)(hidden + (ulong)gid.y * p.dim + gid.x * QB);
  const uint id = ids[p.first + gid.y];
  if (id >= p.vocab) {  // a bad id poisons its row instead of reading outside the table
    for (uint j = 0; j < QB / 4; j++) dst[j] = float4(NAN);
    return;
  }
  const uint g = gid.x * QB / GROUP;
  const float4 s4 = float(scales[(ulong)id * (p.dim / GROUP) + g]);
  const float4 b4 = float(biases[(ulong)id * (p.dim / GROUP) + g]);
  const uint4 wq = ((device const uint4*)w)[(ulong)id * nblk + gid.x];
  for (int j = 0; j < 4; j++) {
    if (BITS == 4) {
      const float4 lo = float4(as_type<uchar4>(wq[j] & 0x0F0F0F0Fu));
      const float4 hi = float4(as_type<uchar4>((wq[j] >> 4) & 0x0F0F0F0Fu));
      dst[2 * j] = fma(s4, float4(lo.x, hi.x, lo.y, hi.y), b4);
      dst[2 * j + 1] = fma(s4, float4(lo.z, hi.z, lo.w, hi.w), b4);
    } else {
      dst[j] = fma(s4, float4(as_type<uchar4>(wq[j])), b4);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Instantiations: <op>_b<bits>_g<group> for bits 4, 8 and groups 32, 64, 128. Written out
// (not macro-generated): the CPU runtime reads kernel signatures before preprocessing.

template [[host_name("qmv_b4_g32")]] [[kernel]] void qmv<4, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b4_g32")]] [[kernel]] void qmv_rows<4, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b4_g32")]] [[kernel]] void qmm<4, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b4_g32")]] [[kernel]] void embed<4, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);

template [[host_name("qmv_b4_g64")]] [[kernel]] void qmv<4, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b4_g64")]] [[kernel]] void qmv_rows<4, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b4_g64")]] [[kernel]] void qmm<4, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b4_g64")]] [[kernel]] void embed<4, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);

template [[host_name("qmv_b4_g128")]] [[kernel]] void qmv<4, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b4_g128")]] [[kernel]] void qmv_rows<4, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b4_g128")]] [[kernel]] void qmm<4, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b4_g128")]] [[kernel]] void embed<4, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);

template [[host_name("qmv_b8_g32")]] [[kernel]] void qmv<8, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b8_g32")]] [[kernel]] void qmv_rows<8, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b8_g32")]] [[kernel]] void qmm<8, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b8_g32")]] [[kernel]] void embed<8, 32>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);

template [[host_name("qmv_b8_g64")]] [[kernel]] void qmv<8, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b8_g64")]] [[kernel]] void qmv_rows<8, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b8_g64")]] [[kernel]] void qmm<8, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b8_g64")]] [[kernel]] void embed<8, 64>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);

template [[host_name("qmv_b8_g128")]] [[kernel]] void qmv<8, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_rows_b8_g128")]] [[kernel]] void qmv_rows<8, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmm_b8_g128")]] [[kernel]] void qmm<8, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* x [[buffer(3)]],
    device float* y [[buffer(4)]], constant QuantMatmulParams& p [[buffer(5)]],
    uint2 tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]);
template [[host_name("embed_b8_g128")]] [[kernel]] void embed<8, 128>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const uint* ids [[buffer(3)]],
    device float* hidden [[buffer(4)]], constant QuantEmbedParams& p [[buffer(5)]],
    uint2 gid [[thread_position_in_grid]]);
