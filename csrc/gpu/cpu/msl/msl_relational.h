// MSL relational functions: NaN/infinity tests, ordered comparisons, select, all, any.
#pragma once
#include "msl_elementwise.h"

namespace metal {

#define MQ_FLOAT_TEST1(name, expr)                          \
  inline bool name(float x) { return expr; }               \
  inline bool name(half x) { return name(float(x)); }      \
  inline bool name(bfloat x) { return name(float(x)); }
#define MQ_FLOAT_TEST2(name, expr)                                        \
  inline bool name(float x, float y) { return expr; }                    \
  inline bool name(half x, half y) { return name(float(x), float(y)); }  \
  inline bool name(bfloat x, bfloat y) { return name(float(x), float(y)); }
MQ_FLOAT_TEST1(isnan, __builtin_isnan(x))
MQ_FLOAT_TEST1(isinf, __builtin_isinf(x))
MQ_FLOAT_TEST1(isfinite, __builtin_isfinite(x))
MQ_FLOAT_TEST1(isnormal, __builtin_isnormal(x))
MQ_FLOAT_TEST1(signbit, __builtin_signbit(x))
MQ_FLOAT_TEST2(isordered, !__builtin_isunordered(x, y))
MQ_FLOAT_TEST2(isunordered, __builtin_isunordered(x, y))
MQ_FLOAT_TEST2(isequal, x == y)
MQ_FLOAT_TEST2(isnotequal, x != y)
MQ_FLOAT_TEST2(isgreater, x > y)
MQ_FLOAT_TEST2(isgreaterequal, x >= y)
MQ_FLOAT_TEST2(isless, x < y)
MQ_FLOAT_TEST2(islessequal, x <= y)
MQ_FLOAT_TEST2(islessgreater, x < y || x > y)
#undef MQ_FLOAT_TEST1
#undef MQ_FLOAT_TEST2
MQ_ELEMENTWISE(isnan)
MQ_ELEMENTWISE(isinf)
MQ_ELEMENTWISE(isfinite)
MQ_ELEMENTWISE(isnormal)
MQ_ELEMENTWISE(signbit)
MQ_ELEMENTWISE(isordered)
MQ_ELEMENTWISE(isunordered)
MQ_ELEMENTWISE(isequal)
MQ_ELEMENTWISE(isnotequal)
MQ_ELEMENTWISE(isgreater)
MQ_ELEMENTWISE(isgreaterequal)
MQ_ELEMENTWISE(isless)
MQ_ELEMENTWISE(islessequal)
MQ_ELEMENTWISE(islessgreater)

// select(a, b, c): c ? b : a, per component when c is a bool vector.
template <class T>
  requires is_scalar_v<T>
constexpr T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
constexpr vec<T, N> select(vec<T, N> a, vec<T, N> b, vec<bool, N> c) {
  vec<T, N> r;
  for (int i = 0; i < N; i++) r.e[i] = c.e[i] ? b.e[i] : a.e[i];
  return r;
}
template <class T, int N>
constexpr vec<T, N> select(vec<T, N> a, vec<T, N> b, bool c) {
  return c ? b : a;
}

constexpr bool all(bool x) { return x; }
constexpr bool any(bool x) { return x; }
template <int N>
constexpr bool all(vec<bool, N> x) {
  for (int i = 0; i < N; i++)
    if (!x.e[i]) return false;
  return true;
}
template <int N>
constexpr bool any(vec<bool, N> x) {
  for (int i = 0; i < N; i++)
    if (x.e[i]) return true;
  return false;
}

}  // namespace metal
