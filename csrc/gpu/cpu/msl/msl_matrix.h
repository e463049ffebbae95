// simdgroup_matrix (8x8) spread over the 32 lanes exactly as on Apple GPUs, so kernels
// that use thread_elements() see the same fragments. Loads, stores and the diagonal
// constructor move each lane's own elements when that lane gets there, so only a
// simdgroup_barrier orders them against other lanes' memory accesses, as on a GPU; the
// runtime checks that all 32 lanes ran them. The multiplies exchange fragments between
// lanes: they are SIMD-group collectives.
#pragma once
#include "msl_simd.h"

namespace metal {

// Lane L holds row (qid & 4) + (L / 2) % 4, columns fn and fn + 1, where qid = L / 4
// and fn = (qid & 2) * 2 + (L % 2) * 2: each quad owns a 2x4 block.
constexpr int mq_fragment_row(int lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
constexpr int mq_fragment_col(int lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }

template <class T, int Cols, int Rows = Cols>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "simdgroup_matrix is 8x8 only");
  vec<T, 2> mq_fragment;

  simdgroup_matrix() = default;
  // Diagonal matrix holding `diagonal` (zeros elsewhere).
  simdgroup_matrix(T diagonal, mq_abi::Site site = MQ_SITE);
  vec<T, 2>& thread_elements() { return mq_fragment; }
  const vec<T, 2>& thread_elements() const { return mq_fragment; }
};
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

// Every lane's fragment takes part: with a lane missing, each present lane gets the fault.
template <class L>
bool mq_all_lanes_present(void* const* lanes) {
  int missing = 0;
  while (missing < 32 && lanes[missing]) missing++;
  if (missing == 32) return true;
  for (int i = 0; i < 32; i++)
    if (lanes[i]) mq_lane_at<L>(lanes, i)->fault = {mq_fault::missing_lane, uint8_t(missing)};
  return false;
}

template <class T, int Cols, int Rows = Cols>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.mq_fragment = vec<T, 2>(value);
  return m;
}

template <class T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows>::simdgroup_matrix(T diagonal, mq_abi::Site site) {
  const int lane = int(mq_runtime->simd_lane_op("simdgroup_matrix(diagonal)", site));
  for (int k = 0; k < 2; k++) mq_fragment.e[k] = mq_fragment_row(lane) == mq_fragment_col(lane) + k ? diagonal : T(0);
}

// Element (row r, col c) lives at memory[(origin.y + r) * elements_per_row + origin.x + c],
// or, transposed, at memory[(origin.x + c) * elements_per_row + origin.y + r].
inline ulong mq_matrix_offset(int lane, int k, ulong elements_per_row, ulong2 origin, bool transpose) {
  const ulong r = ulong(mq_fragment_row(lane)), c = ulong(mq_fragment_col(lane) + k);
  return transpose ? (origin.x + c) * elements_per_row + origin.y + r
                   : (origin.y + r) * elements_per_row + origin.x + c;
}

// Device and threadgroup pointers are both plain pointers here: one overload serves both.
template <class T, int Cols, int Rows>
void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const T* src, ulong elements_per_row = Cols,
                    ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false, mq_abi::Site site = MQ_SITE) {
  const int lane = int(mq_runtime->simd_lane_op("simdgroup_load", site));
  for (int k = 0; k < 2; k++)
    d.mq_fragment.e[k] = src[mq_matrix_offset(lane, k, elements_per_row, matrix_origin, transpose_matrix)];
}
template <class T, int Cols, int Rows>
void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& a, T* dst, ulong elements_per_row = Cols,
                     ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false, mq_abi::Site site = MQ_SITE) {
  const int lane = int(mq_runtime->simd_lane_op("simdgroup_store", site));
  for (int k = 0; k < 2; k++)
    dst[mq_matrix_offset(lane, k, elements_per_row, matrix_origin, transpose_matrix)] = a.mq_fragment.e[k];
}

template <class Td, class Ta, class Tb, class Tc>
struct mq_multiply_lane {
  simdgroup_matrix<Td, 8, 8>* d;
  const simdgroup_matrix<Ta, 8, 8>* a;
  const simdgroup_matrix<Tb, 8, 8>* b;
  const simdgroup_matrix<Tc, 8, 8>* c;  // nullptr: D = A * B
  mq_fault fault;
};
template <class L, class T>
void mq_gather(void* const* lanes, const simdgroup_matrix<T, 8, 8>* L::*which, float (&out)[8][8]) {
  for (int i = 0; i < 32; i++) {
    const simdgroup_matrix<T, 8, 8>* m = mq_lane_at<L>(lanes, i)->*which;
    for (int k = 0; k < 2; k++) out[mq_fragment_row(i)][mq_fragment_col(i) + k] = float(m->mq_fragment.e[k]);
  }
}
// D = A * B + C in float: acc = C[r][c], then acc = acc + A[r][k] * B[k][c] for k = 0..7,
// rounded to D's type at the end. Products of half or bfloat values are exact in float,
// so for them this equals a chain of fused multiply-adds. The loops run k outside c, so a
// row's 8 sums advance together as vectors, each still in that order.
template <class Td, class Ta, class Tb, class Tc>
void mq_multiply_fn(void* const* lanes) {
  using L = mq_multiply_lane<Td, Ta, Tb, Tc>;
  if (!mq_all_lanes_present<L>(lanes)) return;
  float a[8][8], b[8][8], acc[8][8] = {};
  mq_gather(lanes, &L::a, a);
  mq_gather(lanes, &L::b, b);
  if (mq_lane_at<L>(lanes, 0)->c) mq_gather(lanes, &L::c, acc);
  for (int r = 0; r < 8; r++)
    for (int k = 0; k < 8; k++)
      for (int col = 0; col < 8; col++) acc[r][col] = acc[r][col] + a[r][k] * b[k][col];
  for (int i = 0; i < 32; i++)
    for (int k = 0; k < 2; k++)
      mq_lane_at<L>(lanes, i)->d->mq_fragment.e[k] = Td(acc[mq_fragment_row(i)][mq_fragment_col(i) + k]);
}

template <class Td, class Ta, class Tb, class Tc>
void simdgroup_multiply_accumulate(simdgroup_matrix<Td, 8, 8>& d, const simdgroup_matrix<Ta, 8, 8>& a,
                                   const simdgroup_matrix<Tb, 8, 8>& b, const simdgroup_matrix<Tc, 8, 8>& c,
                                   mq_abi::Site site = MQ_SITE) {
  mq_multiply_lane<Td, Ta, Tb, Tc> lane{&d, &a, &b, &c, {}};
  mq_run(&mq_multiply_fn<Td, Ta, Tb, Tc>, lane, site, "simdgroup_multiply_accumulate");
}
template <class Td, class Ta, class Tb>
void simdgroup_multiply(simdgroup_matrix<Td, 8, 8>& d, const simdgroup_matrix<Ta, 8, 8>& a,
                        const simdgroup_matrix<Tb, 8, 8>& b, mq_abi::Site site = MQ_SITE) {
  mq_multiply_lane<Td, Ta, Tb, Td> lane{&d, &a, &b, nullptr, {}};
  mq_run(&mq_multiply_fn<Td, Ta, Tb, Td>, lane, site, "simdgroup_multiply");
}

}  // namespace metal

using metal::simdgroup_bfloat8x8;
using metal::simdgroup_float8x8;
using metal::simdgroup_half8x8;
