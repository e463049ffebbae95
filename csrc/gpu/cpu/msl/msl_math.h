// MSL math functions for float, half and bfloat, scalars and vectors, plus as_type.
// No <cmath>: its global double overloads would make exp(x) ambiguous after
// `using namespace metal`. Everything computes precisely in float (half and bfloat
// round the float result); fast:: and precise:: are the same functions.
#pragma once
#include "msl_integer.h"

namespace metal {

// A float function `name(float x)` given by `expr`, with its half and bfloat forms (vectors below).
// A double argument (an unsuffixed literal) computes in float, as MSL has no double.
#define MQ_FLOAT1(name, expr)                                          \
  inline float name(float x) { return expr; }                         \
  inline half name(half x) { return half(name(float(x))); }           \
  inline bfloat name(bfloat x) { return bfloat(name(float(x))); }     \
  inline float name(double x) { return name(float(x)); }
#define MQ_FLOAT2(name, expr)                                                          \
  inline float name(float x, float y) { return expr; }                                \
  inline half name(half x, half y) { return half(name(float(x), float(y))); }         \
  inline bfloat name(bfloat x, bfloat y) { return bfloat(name(float(x), float(y))); }
#define MQ_FLOAT3(name, expr)                                                                               \
  inline float name(float x, float y, float z) { return expr; }                                            \
  inline half name(half x, half y, half z) { return half(name(float(x), float(y), float(z))); }            \
  inline bfloat name(bfloat x, bfloat y, bfloat z) { return bfloat(name(float(x), float(y), float(z))); }

// IEEE minNum/maxNum (a NaN operand yields the other), inline instead of a libm call.
constexpr float mq_fmin(float x, float y) { return (y < x || x != x) ? y : x; }
constexpr float mq_fmax(float x, float y) { return (x < y || x != x) ? y : x; }

MQ_FLOAT1(fabs, __builtin_fabsf(x))
MQ_FLOAT1(abs, __builtin_fabsf(x))
MQ_FLOAT1(floor, __builtin_floorf(x))
MQ_FLOAT1(ceil, __builtin_ceilf(x))
MQ_FLOAT1(trunc, __builtin_truncf(x))
MQ_FLOAT1(round, __builtin_roundf(x))  // halfway cases away from zero
MQ_FLOAT1(rint, __builtin_rintf(x))    // halfway cases to even
MQ_FLOAT1(fract, mq_fmin(x - __builtin_floorf(x), 0x1.fffffep-1f))
MQ_FLOAT1(sqrt, __builtin_sqrtf(x))
MQ_FLOAT1(rsqrt, 1.0f / __builtin_sqrtf(x))
MQ_FLOAT1(exp, __builtin_expf(x))
MQ_FLOAT1(exp2, __builtin_exp2f(x))
MQ_FLOAT1(exp10, __builtin_powf(10.0f, x))
MQ_FLOAT1(log, __builtin_logf(x))
MQ_FLOAT1(log2, __builtin_log2f(x))
MQ_FLOAT1(log10, __builtin_log10f(x))
MQ_FLOAT1(sin, __builtin_sinf(x))
MQ_FLOAT1(cos, __builtin_cosf(x))
MQ_FLOAT1(tan, __builtin_tanf(x))
MQ_FLOAT1(asin, __builtin_asinf(x))
MQ_FLOAT1(acos, __builtin_acosf(x))
MQ_FLOAT1(atan, __builtin_atanf(x))
MQ_FLOAT1(sinh, __builtin_sinhf(x))
MQ_FLOAT1(cosh, __builtin_coshf(x))
MQ_FLOAT1(tanh, __builtin_tanhf(x))
MQ_FLOAT1(asinh, __builtin_asinhf(x))
MQ_FLOAT1(acosh, __builtin_acoshf(x))
MQ_FLOAT1(atanh, __builtin_atanhf(x))
MQ_FLOAT1(sinpi, float(__builtin_sin(3.14159265358979323846 * x)))
MQ_FLOAT1(cospi, float(__builtin_cos(3.14159265358979323846 * x)))
MQ_FLOAT1(tanpi, float(__builtin_tan(3.14159265358979323846 * x)))
MQ_FLOAT1(saturate, mq_fmin(mq_fmax(x, 0.0f), 1.0f))
// 1 or -1 by sign; zeros keep their sign; NaN gives 0.
MQ_FLOAT1(sign, x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == 0.0f ? x : 0.0f)

// min and max behave as fmin and fmax (MSL leaves NaN operands of min/max undefined).
MQ_FLOAT2(fmin, mq_fmin(x, y))
MQ_FLOAT2(fmax, mq_fmax(x, y))
MQ_FLOAT2(min, mq_fmin(x, y))
MQ_FLOAT2(max, mq_fmax(x, y))
MQ_FLOAT2(pow, __builtin_powf(x, y))
MQ_FLOAT2(powr, __builtin_powf(x, y))
MQ_FLOAT2(atan2, __builtin_atan2f(x, y))
MQ_FLOAT2(fmod, __builtin_fmodf(x, y))
MQ_FLOAT2(copysign, __builtin_copysignf(x, y))
MQ_FLOAT2(fdim, __builtin_fdimf(x, y))
MQ_FLOAT2(nextafter, __builtin_nextafterf(x, y))
MQ_FLOAT2(divide, x / y)
MQ_FLOAT2(step, y < x ? 0.0f : 1.0f)  // step(edge, x)

inline float mq_smoothstep(float edge0, float edge1, float x) {
  const float t = mq_fmin(mq_fmax((x - edge0) / (edge1 - edge0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
MQ_FLOAT3(fma, __builtin_fmaf(x, y, z))
MQ_FLOAT3(mad, __builtin_fmaf(x, y, z))
MQ_FLOAT3(clamp, mq_fmin(mq_fmax(x, y), z))
MQ_FLOAT3(mix, x + (y - x) * z)
MQ_FLOAT3(smoothstep, mq_smoothstep(x, y, z))
#undef MQ_FLOAT1
#undef MQ_FLOAT2
#undef MQ_FLOAT3

template <class T>
constexpr T min3(T x, T y, T z) {
  return min(min(x, y), z);
}
template <class T>
constexpr T max3(T x, T y, T z) {
  return max(max(x, y), z);
}
template <class T>
constexpr T median3(T x, T y, T z) {
  return max(min(x, y), min(max(x, y), z));
}
template <class T>
constexpr T fmin3(T x, T y, T z) {
  return fmin(fmin(x, y), z);
}
template <class T>
constexpr T fmax3(T x, T y, T z) {
  return fmax(fmax(x, y), z);
}
template <class T>
constexpr T fmedian3(T x, T y, T z) {
  return fmax(fmin(x, y), fmin(fmax(x, y), z));
}

// Functions whose extra results come back through references, and ldexp's int exponent.
template <mq_floating T>
T sincos(T x, T& cosval) {
  cosval = cos(x);
  return sin(x);
}
template <mq_floating T>
T frexp(T x, int& exponent) {
  return T(__builtin_frexpf(float(x), &exponent));
}
template <mq_floating T>
T modf(T x, T& intval) {
  intval = trunc(x);
  return T(float(x) - float(intval));
}
template <mq_floating T>
T ldexp(T x, int k) {
  return T(__builtin_ldexpf(float(x), k));
}
// Vector results go to a local first and are assigned whole (see MQ_VEC_MEMBERS).
template <class T, int N>
vec<T, N> sincos(vec<T, N> x, vec<T, N>& cosval) {
  vec<T, N> s, c;
  for (int i = 0; i < N; i++) s.e[i] = sincos(x.e[i], c.e[i]);
  cosval = c;
  return s;
}
template <class T, int N>
vec<T, N> frexp(vec<T, N> x, vec<int, N>& exponent) {
  vec<T, N> m;
  vec<int, N> k;
  for (int i = 0; i < N; i++) m.e[i] = frexp(x.e[i], k.e[i]);
  exponent = k;
  return m;
}
template <class T, int N>
vec<T, N> modf(vec<T, N> x, vec<T, N>& intval) {
  vec<T, N> f, w;
  for (int i = 0; i < N; i++) f.e[i] = modf(x.e[i], w.e[i]);
  intval = w;
  return f;
}
template <class T, int N>
vec<T, N> ldexp(vec<T, N> x, vec<int, N> k) {
  vec<T, N> r;
  for (int i = 0; i < N; i++) r.e[i] = ldexp(x.e[i], k.e[i]);
  return r;
}
template <class T, int N>
vec<T, N> ldexp(vec<T, N> x, int k) {
  return ldexp(x, vec<int, N>(k));
}

// Elementwise vector forms: declared after all scalar overloads (see MQ_ELEMENTWISE).
#define MQ_MATH_FUNCTIONS(X)                                                                            \
  X(fabs) X(abs) X(floor) X(ceil) X(trunc) X(round) X(rint) X(fract) X(sqrt) X(rsqrt) X(exp) X(exp2)    \
  X(exp10) X(log) X(log2) X(log10) X(sin) X(cos) X(tan) X(asin) X(acos) X(atan) X(sinh) X(cosh)         \
  X(tanh) X(asinh) X(acosh) X(atanh) X(sinpi) X(cospi) X(tanpi) X(saturate) X(sign) X(fmin) X(fmax)     \
  X(min) X(max) X(pow) X(powr) X(atan2) X(fmod) X(copysign) X(fdim) X(nextafter) X(divide) X(step)      \
  X(fma) X(mad) X(clamp) X(mix) X(smoothstep)
MQ_MATH_FUNCTIONS(MQ_ELEMENTWISE)

// Reinterprets the bits of x; MSL requires equal sizes.
template <class To, class From>
constexpr To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
  if constexpr (__is_trivially_copyable(To) && __is_trivially_copyable(From)) {
    return __builtin_bit_cast(To, x);
  } else {
    To r;
    __builtin_memcpy(static_cast<void*>(&r), static_cast<const void*>(&x), sizeof(To));
    return r;
  }
}

#define MQ_USING(name) using metal::name;
#define MQ_MATH_EXTRAS(X) X(sincos) X(frexp) X(modf) X(ldexp) X(min3) X(max3) X(median3) X(fmin3) X(fmax3) X(fmedian3)
namespace fast {
MQ_MATH_FUNCTIONS(MQ_USING)
MQ_MATH_EXTRAS(MQ_USING)
}  // namespace fast
namespace precise {
MQ_MATH_FUNCTIONS(MQ_USING)
MQ_MATH_EXTRAS(MQ_USING)
}  // namespace precise
#undef MQ_USING
#undef MQ_MATH_EXTRAS
#undef MQ_MATH_FUNCTIONS

}  // namespace metal
