// MSL integer functions on every integer type (char ... ulong), scalars and vectors.
// abs, min, max and clamp of integers live here too; msl_math.h lifts them to vectors.
#pragma once
#include "msl_elementwise.h"
#include "msl_limits.h"

namespace metal {

template <class T>
using mq_unsigned_t = make_unsigned_t<remove_cv_t<T>>;
template <class T>
inline constexpr int mq_bits_v = int(sizeof(T) * 8);
// A type twice as wide, for mulhi.
__extension__ typedef __int128 mq_int128;
__extension__ typedef unsigned __int128 mq_uint128;
template <class T>
using mq_wider_t = conditional_t<(sizeof(T) < 8), conditional_t<is_signed_v<T>, long, ulong>,
                                 conditional_t<is_signed_v<T>, mq_int128, mq_uint128>>;

template <mq_integer T>
constexpr T abs(T x) {
  return x < 0 ? T(mq_unsigned_t<T>(0) - mq_unsigned_t<T>(x)) : x;
}
template <mq_integer T>
constexpr T min(T a, T b) {
  return b < a ? b : a;
}
template <mq_integer T>
constexpr T max(T a, T b) {
  return a < b ? b : a;
}
template <mq_integer T>
constexpr T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}

template <mq_integer T>
constexpr T popcount(T x) {
  return T(__builtin_popcountll(mq_unsigned_t<T>(x)));
}
template <mq_integer T>
constexpr T clz(T x) {
  return x == 0 ? T(mq_bits_v<T>) : T(__builtin_clzll(mq_unsigned_t<T>(x)) - (64 - mq_bits_v<T>));
}
template <mq_integer T>
constexpr T ctz(T x) {
  return x == 0 ? T(mq_bits_v<T>) : T(__builtin_ctzll(mq_unsigned_t<T>(x)));
}
template <mq_integer T>
constexpr T reverse_bits(T x) {
  mq_unsigned_t<T> v = x, r = 0;
  for (int i = 0; i < mq_bits_v<T>; i++, v >>= 1) r = mq_unsigned_t<T>((r << 1) | (v & 1));
  return T(r);
}

// Bits [offset, offset + bits) of x, sign-extended for signed T; 0 when bits == 0.
template <mq_integer T>
constexpr T extract_bits(T x, uint offset, uint bits) {
  if (bits == 0) return T(0);
  using U = mq_unsigned_t<T>;
  const U field = U(U(x) >> offset) & U(~U(0) >> (mq_bits_v<T> - bits));
  if (is_signed_v<T> && bits < uint(mq_bits_v<T>) && ((field >> (bits - 1)) & 1)) return T(field | U(~U(0) << bits));
  return T(field);
}
template <mq_integer T>
constexpr T insert_bits(T base, T insert, uint offset, uint bits) {
  if (bits == 0) return base;
  using U = mq_unsigned_t<T>;
  const U mask = U(U(~U(0) >> (mq_bits_v<T> - bits)) << offset);
  return T((U(base) & U(~mask)) | (U(U(insert) << offset) & mask));
}

template <mq_integer T>
constexpr T mulhi(T x, T y) {
  return T((mq_wider_t<T>(x) * mq_wider_t<T>(y)) >> mq_bits_v<T>);
}
template <mq_integer T>
constexpr T madhi(T a, T b, T c) {
  return T(mulhi(a, b) + c);
}
template <mq_integer T>
constexpr T absdiff(T x, T y) {
  return T(x > y ? mq_unsigned_t<T>(mq_unsigned_t<T>(x) - mq_unsigned_t<T>(y))
                 : mq_unsigned_t<T>(mq_unsigned_t<T>(y) - mq_unsigned_t<T>(x)));
}
// (x + y) >> 1 and (x + y + 1) >> 1 without overflow.
template <mq_integer T>
constexpr T hadd(T x, T y) {
  return T((x >> 1) + (y >> 1) + (x & y & 1));
}
template <mq_integer T>
constexpr T rhadd(T x, T y) {
  return T((x >> 1) + (y >> 1) + ((x | y) & 1));
}
template <mq_integer T>
constexpr T rotate(T v, T i) {
  using U = mq_unsigned_t<T>;
  const int s = int(U(i) % mq_bits_v<T>);
  return s == 0 ? v : T(U(U(v) << s) | U(U(v) >> (mq_bits_v<T> - s)));
}
template <mq_integer T>
constexpr T addsat(T x, T y) {
  T r{};
  if (!__builtin_add_overflow(x, y, &r)) return r;
  return is_signed_v<T> && x < 0 ? numeric_limits<T>::min() : numeric_limits<T>::max();
}
template <mq_integer T>
constexpr T subsat(T x, T y) {
  T r{};
  if (!__builtin_sub_overflow(x, y, &r)) return r;
  return is_signed_v<T> && x >= 0 ? numeric_limits<T>::max() : numeric_limits<T>::min();
}

MQ_ELEMENTWISE(popcount)
MQ_ELEMENTWISE(clz)
MQ_ELEMENTWISE(ctz)
MQ_ELEMENTWISE(reverse_bits)
MQ_ELEMENTWISE(extract_bits)
MQ_ELEMENTWISE(insert_bits)
MQ_ELEMENTWISE(mulhi)
MQ_ELEMENTWISE(madhi)
MQ_ELEMENTWISE(absdiff)
MQ_ELEMENTWISE(hadd)
MQ_ELEMENTWISE(rhadd)
MQ_ELEMENTWISE(rotate)
MQ_ELEMENTWISE(addsat)
MQ_ELEMENTWISE(subsat)

}  // namespace metal
