// MSL geometric functions. half and bfloat accumulate in float and round the result.
#pragma once
#include "msl_math.h"

namespace metal {

template <class T>
using mq_accum_t = conditional_t<__is_same(T, half) || __is_same(T, bfloat), float, T>;

// Products summed in component order: x*x' + y*y' + z*z' + w*w'.
template <class T, int N>
constexpr T dot(vec<T, N> a, vec<T, N> b) {
  using A = mq_accum_t<T>;
  A sum = A(a.e[0]) * A(b.e[0]);
  for (int i = 1; i < N; i++) sum = sum + A(a.e[i]) * A(b.e[i]);
  return T(sum);
}
template <class T, int N>
constexpr T length_squared(vec<T, N> x) {
  return dot(x, x);
}
template <class T, int N>
T length(vec<T, N> x) {
  using A = mq_accum_t<T>;
  return T(sqrt(A(dot(vec<A, N>(x), vec<A, N>(x)))));
}
template <class T, int N>
T distance(vec<T, N> a, vec<T, N> b) {
  return length(a - b);
}
template <class T, int N>
constexpr T distance_squared(vec<T, N> a, vec<T, N> b) {
  return length_squared(a - b);
}
template <class T, int N>
vec<T, N> normalize(vec<T, N> x) {
  using A = mq_accum_t<T>;
  const vec<A, N> w(x);
  return vec<T, N>(w * rsqrt(dot(w, w)));
}
template <class T>
constexpr vec<T, 3> cross(vec<T, 3> a, vec<T, 3> b) {
  return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}

}  // namespace metal
