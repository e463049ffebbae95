// simdgroup_matrix (8x8) spread over the 32 lanes exactly as on Apple GPUs, so kernels
// that use thread_elements() see the same fragments. Loads, stores, the diagonal
// constructor and the multiplies are SIMD-group collectives; all 32 lanes must take part.
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

template <class T>
struct mq_diagonal_lane {
  simdgroup_matrix<T, 8, 8>* matrix;
  T value;
  mq_fault fault;
};
template <class T>
void mq_diagonal_fn(void* const* lanes) {
  if (!mq_all_lanes_present<mq_diagonal_lane<T>>(lanes)) return;
  for (int i = 0; i < 32; i++) {
    auto* lane = mq_lane_at<mq_diagonal_lane<T>>(lanes, i);
    for (int k = 0; k < 2; k++)
      lane->matrix->mq_fragment.e[k] = mq_fragment_row(i) == mq_fragment_col(i) + k ? lane->value : T(0);
  }
}
template <class T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows>::simdgroup_matrix(T diagonal, mq_abi::Site site) {
  mq_diagonal_lane<T> lane{this, diagonal, {}};
  mq_run(&mq_diagonal_fn<T>, lane, site, "simdgroup_matrix(diagonal)");
}

// Each lane moves its own two elements with its own arguments. Element (row r, col c)
// lives at memory[(origin.y + r) * elements_per_row + origin.x + c], or, transposed,
// at memory[(origin.x + c) * elements_per_row + origin.y + r].
template <class M, class P>
struct mq_matrix_io_lane {
  M* matrix;  // const for a store
  P* memory;
  ulong elements_per_row, origin_x, origin_y;
  bool transpose;
  mq_fault fault;
};
template <class M, class P, bool Store>
void mq_matrix_io_fn(void* const* lanes) {
  if (!mq_all_lanes_present<mq_matrix_io_lane<M, P>>(lanes)) return;
  for (int i = 0; i < 32; i++) {
    auto* lane = mq_lane_at<mq_matrix_io_lane<M, P>>(lanes, i);
    for (int k = 0; k < 2; k++) {
      const ulong r = ulong(mq_fragment_row(i)), c = ulong(mq_fragment_col(i) + k);
      const ulong at = lane->transpose ? (lane->origin_x + c) * lane->elements_per_row + lane->origin_y + r
                                       : (lane->origin_y + r) * lane->elements_per_row + lane->origin_x + c;
      if constexpr (Store)
        lane->memory[at] = lane->matrix->mq_fragment.e[k];
      else
        lane->matrix->mq_fragment.e[k] = lane->memory[at];
    }
  }
}

// Device and threadgroup pointers are both plain pointers here: one overload serves both.
template <class T, int Cols, int Rows>
void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const T* src, ulong elements_per_row = Cols,
                    ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false, mq_abi::Site site = MQ_SITE) {
  using M = simdgroup_matrix<T, Cols, Rows>;
  mq_matrix_io_lane<M, const T> lane{&d, src, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix, {}};
  mq_run(&mq_matrix_io_fn<M, const T, false>, lane, site, "simdgroup_load");
}
template <class T, int Cols, int Rows>
void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& a, T* dst, ulong elements_per_row = Cols,
                     ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false, mq_abi::Site site = MQ_SITE) {
  using M = const simdgroup_matrix<T, Cols, Rows>;
  mq_matrix_io_lane<M, T> lane{&a, dst, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix, {}};
  mq_run(&mq_matrix_io_fn<M, T, true>, lane, site, "simdgroup_store");
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
// so for them this equals a chain of fused multiply-adds.
template <class Td, class Ta, class Tb, class Tc>
void mq_multiply_fn(void* const* lanes) {
  using L = mq_multiply_lane<Td, Ta, Tb, Tc>;
  if (!mq_all_lanes_present<L>(lanes)) return;
  float a[8][8], b[8][8], c[8][8] = {};
  mq_gather(lanes, &L::a, a);
  mq_gather(lanes, &L::b, b);
  if (mq_lane_at<L>(lanes, 0)->c) mq_gather(lanes, &L::c, c);
  for (int i = 0; i < 32; i++) {
    for (int k = 0; k < 2; k++) {
      const int r = mq_fragment_row(i), col = mq_fragment_col(i) + k;
      float acc = c[r][col];
      for (int j = 0; j < 8; j++) acc = acc + a[r][j] * b[j][col];
      mq_lane_at<L>(lanes, i)->d->mq_fragment.e[k] = Td(acc);
    }
  }
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
