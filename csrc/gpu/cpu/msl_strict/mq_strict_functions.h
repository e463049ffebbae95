// Math, integer, relational, geometric and conversion functions of MSL for the
// strict check: each takes its arguments by value (T: a scalar or vector type).
#pragma once

namespace metal {
// Declared per type, as Metal does, so a scalar argument converts to a vector parameter.
#define MQ_STRICT_EACH_FLOAT(M) \
  M(half) M(half2) M(half3) M(half4) M(float) M(float2) M(float3) M(float4) M(bfloat) M(bfloat2) M(bfloat3) M(bfloat4)
#define MQ_STRICT_EACH_INTEGER(M)                                                                          \
  M(char) M(char2) M(char3) M(char4) M(uchar) M(uchar2) M(uchar3) M(uchar4) M(short) M(short2) M(short3)  \
  M(short4) M(ushort) M(ushort2) M(ushort3) M(ushort4) M(int) M(int2) M(int3) M(int4) M(uint) M(uint2)    \
  M(uint3) M(uint4) M(long) M(long2) M(long3) M(long4) M(ulong) M(ulong2) M(ulong3) M(ulong4)

#define MQ_STRICT_MATH(T)                                                                                   \
  T acos(T); T acosh(T); T asin(T); T asinh(T); T atan(T); T atanh(T); T ceil(T); T cos(T); T cosh(T);      \
  T cospi(T); T exp(T); T exp2(T); T exp10(T); T fabs(T); T floor(T); T fract(T); T log(T); T log2(T);      \
  T log10(T); T rint(T); T round(T); T rsqrt(T); T sin(T); T sinh(T); T sinpi(T); T sqrt(T); T tan(T);      \
  T tanh(T); T tanpi(T); T trunc(T); T saturate(T); T sign(T); T atan2(T, T); T copysign(T, T);            \
  T divide(T, T); T fdim(T, T); T fmax(T, T); T fmin(T, T); T fmod(T, T); T pow(T, T); T powr(T, T);       \
  T step(T, T); T fma(T, T, T);
#define MQ_STRICT_FLOAT_ONLY(T)                                                                             \
  T mix(T, T, T); T smoothstep(T, T, T); T ldexp(T, int); T modf(T, thread T&); T sincos(T, thread T&);
MQ_STRICT_EACH_FLOAT(MQ_STRICT_MATH)
MQ_STRICT_EACH_FLOAT(MQ_STRICT_FLOAT_ONLY)
namespace fast { MQ_STRICT_EACH_FLOAT(MQ_STRICT_MATH) }
namespace precise { MQ_STRICT_EACH_FLOAT(MQ_STRICT_MATH) }

#define MQ_STRICT_COMMON(T) T abs(T); T min(T, T); T max(T, T); T clamp(T, T, T);
MQ_STRICT_EACH_FLOAT(MQ_STRICT_COMMON)
MQ_STRICT_EACH_INTEGER(MQ_STRICT_COMMON)
#define MQ_STRICT_INTEGER(T)                                                                                \
  T absdiff(T, T); T popcount(T); T clz(T); T ctz(T); T reverse_bits(T); T mulhi(T, T); T rotate(T, T);   \
  T add_sat(T, T); T sub_sat(T, T); T extract_bits(T, uint, uint); T insert_bits(T, T, uint, uint);
MQ_STRICT_EACH_INTEGER(MQ_STRICT_INTEGER)
#undef MQ_STRICT_MATH
#undef MQ_STRICT_FLOAT_ONLY
#undef MQ_STRICT_COMMON
#undef MQ_STRICT_INTEGER
#undef MQ_STRICT_EACH_FLOAT
#undef MQ_STRICT_EACH_INTEGER

template <class T> using mq_if_float = enable_if_t<mq_scalar_of<T>::floating, T>;
template <class T> using mq_if_arith = enable_if_t<mq_scalar_of<T>::arithmetic, T>;

// Relational functions: a bool, or for vectors what a vector comparison gives.
template <class T> using mq_test_of = enable_if_t<mq_scalar_of<T>::floating, decltype(T() != T())>;
template <class T> mq_test_of<T> isnan(T);
template <class T> mq_test_of<T> isinf(T);
template <class T> mq_test_of<T> isfinite(T);
template <class T> mq_test_of<T> isnormal(T);
template <class T> mq_test_of<T> signbit(T);
template <class T> enable_if_t<mq_scalar_of<T>::arithmetic, bool> all(T);
template <class T> enable_if_t<mq_scalar_of<T>::arithmetic, bool> any(T);
template <class T, class B> mq_if_arith<T> select(T, T, B);

// Geometric functions.
template <class T> mq_scalar_t<mq_if_float<T>> dot(T, T);
template <class T> mq_scalar_t<mq_if_float<T>> length(T);
template <class T> mq_scalar_t<mq_if_float<T>> length_squared(T);
template <class T> mq_scalar_t<mq_if_float<T>> distance(T, T);
template <class T> mq_if_float<T> normalize(T);
template <class T> mq_if_float<T> cross(T, T);

// as_type reinterprets bits between types of one size.
template <class To, class From> enable_if_t<sizeof(To) == sizeof(From), To> as_type(From);
}  // namespace metal
