#include <metal_stdlib>
using namespace metal;
#include "params.h"
// The walk and the formats of quant.metal; the gated norm's factor of deltanet.metal.
#include "quant.metal"
#include "deltanet.metal"

// DeltaNet's out_proj in decode and verify steps with the gated output norm's per-head factor
// folded into its input load (params/quant.h, QmvHeadNormParams): delta_conv_scan leaves
// g = y * norm_w * silu(z) and each head's partial sums of y^2, and since a block of
// MQ_QUANT_BLOCK inputs lies inside one head, the walk scales each block it loads by its
// head's factor: no norm dispatch and no barrier between the scan and out_proj.
//   qmv_head_norm[_rows]  y[r] = W (g[r] * f[r]), f[r] = mq_delta::head_norm_inv per head
// The block's values are g * f exactly as delta_norm_history leaves them in place (one
// multiply, the same factor), so a row gives the bits of that kernel followed by qmv[_rows];
// *_rows take 1..MQ_QMV_MAX_ROWS rows with one weight stream, a verify row bit-identical to
// the one-row kernel's.
static_assert(MQ_DELTA_HEAD_DIM % MQ_QUANT_BLOCK == 0, "a walk block must lie inside one head");

// Rows of g with their heads' factors, formed per block from head_ss as the walk loads it.
struct HeadNormedRows {
  device const float* g;        // [rows][stride]
  device const float* head_ss;  // [rows][ss_stride]: head h's partials at h * MQ_DELTA_HEAD_PARTIALS
  uint stride, ss_stride;
  float eps;
  // Block blk of row r, times its head's factor, into xv (8 float4s); returns its sum (load_x).
  float load(uint r, uint blk, thread float4* xv) const {
    const uint e = blk * QBLOCK;
    const uint head = e / MQ_DELTA_HEAD_DIM;
    const float f = mq_delta::head_norm_inv(head_ss + (ulong)r * ss_stride + head * MQ_DELTA_HEAD_PARTIALS, eps);
    device const float4* g4 = (device const float4*)(g + (ulong)r * stride + e);
    float4 sum = 0.0f;
    for (uint i = 0; i < QBLOCK / 4; i++) {
      xv[i] = g4[i] * f;
      sum += xv[i];
    }
    return (sum.x + sum.y) + (sum.z + sum.w);
  }
};

// ---------------------------------------------------------------------------------------
// y[r] = W (g[r] * f[r]) for r < min(p.rows, M): M = 1 (qmv_head_norm, decode) or
// MQ_QMV_MAX_ROWS (qmv_head_norm_rows, verify); grid and threadgroups as qmv's R variant.
template <typename Fmt, int M, int R>
[[kernel]] void qmv_head_norm(
    device const uint* w [[buffer(0)]],                         // [out_dim][in_dim / 32 * WORDS]
    device const typename Fmt::scale_t* scales [[buffer(1)]],  // [out_dim][in_dim/GROUP]
    device const typename Fmt::scale_t* biases [[buffer(2)]],  // [out_dim][in_dim/GROUP]
    device const float* g [[buffer(3)]],                        // [rows][x_stride], first in_dim used
    device const float* head_ss [[buffer(4)]],                  // [rows][ss_stride]
    device float* y [[buffer(5)]],                              // [rows][y_stride], first out_dim written
    constant QmvHeadNormParams& p [[buffer(6)]],
    uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  HeadNormedRows xs{g, head_ss, p.x_stride, p.ss_stride, p.eps};
  qmv_rows_body<Fmt, M, R>(QuantWeights<Fmt>{w, scales, biases}, xs, y, p.y_stride, p.in_dim, p.out_dim, 0,
                           min(p.rows, (uint)M), tg, sg, lane);
}

// ---------------------------------------------------------------------------------------
// Instantiations: qmv_head_norm[_rows]_r<R>_<format> (R = 2, 4, 8 rows per SIMD-group) for
// every format of quant.metal. Written out (not macro-generated): the CPU runtime reads kernel
// signatures before preprocessing.
template [[host_name("qmv_head_norm_r2_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b2_g32")]] [[kernel]] void qmv_head_norm<affine<2, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b2_g64")]] [[kernel]] void qmv_head_norm<affine<2, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b2_g128")]] [[kernel]] void qmv_head_norm<affine<2, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b3_g32")]] [[kernel]] void qmv_head_norm<affine<3, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b3_g64")]] [[kernel]] void qmv_head_norm<affine<3, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b3_g128")]] [[kernel]] void qmv_head_norm<affine<3, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b4_g32")]] [[kernel]] void qmv_head_norm<affine<4, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b4_g64")]] [[kernel]] void qmv_head_norm<affine<4, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b4_g128")]] [[kernel]] void qmv_head_norm<affine<4, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b5_g32")]] [[kernel]] void qmv_head_norm<affine<5, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b5_g64")]] [[kernel]] void qmv_head_norm<affine<5, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b5_g128")]] [[kernel]] void qmv_head_norm<affine<5, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b6_g32")]] [[kernel]] void qmv_head_norm<affine<6, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b6_g64")]] [[kernel]] void qmv_head_norm<affine<6, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b6_g128")]] [[kernel]] void qmv_head_norm<affine<6, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b8_g32")]] [[kernel]] void qmv_head_norm<affine<8, 32>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b8_g64")]] [[kernel]] void qmv_head_norm<affine<8, 64>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, 1, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, 1, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, 1, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b8_g128")]] [[kernel]] void qmv_head_norm<affine<8, 128>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const bfloat* scales [[buffer(1)]],
    device const bfloat* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_mxfp4")]] [[kernel]] void qmv_head_norm<mxfp4, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_nvfp4")]] [[kernel]] void qmv_head_norm<nvfp4, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_mxfp8")]] [[kernel]] void qmv_head_norm<mxfp8, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_bf16")]] [[kernel]] void qmv_head_norm<dense<bfloat>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_f16")]] [[kernel]] void qmv_head_norm<dense<half>, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_f16")]] [[kernel]] void qmv_head_norm<dense<half>, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_f16")]] [[kernel]] void qmv_head_norm<dense<half>, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_f16")]] [[kernel]] void qmv_head_norm<dense<half>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_f16")]] [[kernel]] void qmv_head_norm<dense<half>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_f16")]] [[kernel]] void qmv_head_norm<dense<half>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_f32")]] [[kernel]] void qmv_head_norm<dense<float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_f32")]] [[kernel]] void qmv_head_norm<dense<float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_f32")]] [[kernel]] void qmv_head_norm<dense<float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_f32")]] [[kernel]] void qmv_head_norm<dense<float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_f32")]] [[kernel]] void qmv_head_norm<dense<float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_f32")]] [[kernel]] void qmv_head_norm<dense<float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const uchar* scales [[buffer(1)]],
    device const uchar* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b2_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<2, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b3_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<3, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b4_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<4, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b5_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<5, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b6_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<6, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r2_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, 1, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r4_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, 1, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_r8_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, 1, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r2_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, MQ_QMV_MAX_ROWS, 2>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r4_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, MQ_QMV_MAX_ROWS, 4>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
template [[host_name("qmv_head_norm_rows_r8_b8_g64_sf32")]] [[kernel]] void qmv_head_norm<affine<8, 64, float>, MQ_QMV_MAX_ROWS, 8>(
    device const uint* w [[buffer(0)]], device const float* scales [[buffer(1)]],
    device const float* biases [[buffer(2)]], device const float* g [[buffer(3)]],
    device const float* head_ss [[buffer(4)]], device float* y [[buffer(5)]],
    constant QmvHeadNormParams& p [[buffer(6)]], uint tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]);
