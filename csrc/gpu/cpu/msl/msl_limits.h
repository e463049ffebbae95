// metal::numeric_limits and the constant macros of MSL (float, half and integer limits,
// math constants). Macros another header may already define are guarded.
#pragma once
#include "msl_traits.h"

namespace metal {

template <class T>
struct numeric_limits {
  static constexpr bool is_specialized = false;
};

template <class T>
  requires mq_integer<T>
struct numeric_limits<T> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = is_signed_v<T>;
  static constexpr bool is_integer = true;
  static constexpr int digits = int(sizeof(T) * 8) - (is_signed_v<T> ? 1 : 0);
  static constexpr T max() { return T(make_unsigned_t<T>(~make_unsigned_t<T>(0)) >> (is_signed ? 1 : 0)); }
  static constexpr T min() { return is_signed ? T(-max() - 1) : T(0); }
  static constexpr T lowest() { return min(); }
  static constexpr T epsilon() { return T(0); }
  static constexpr T infinity() { return T(0); }
  static constexpr T quiet_NaN() { return T(0); }
};

// Floating types, from their bit patterns: smallest normal, largest finite, epsilon,
// infinity, quiet NaN, smallest subnormal.
#define MQ_FLOAT_LIMITS(T, U, digits_, min_, max_, eps_, inf_, nan_, denorm_)     \
  template <>                                                                    \
  struct numeric_limits<T> {                                                     \
    static constexpr bool is_specialized = true;                                 \
    static constexpr bool is_signed = true;                                      \
    static constexpr bool is_integer = false;                                    \
    static constexpr int digits = digits_;                                       \
    static constexpr T mq_bits(U b) { return __builtin_bit_cast(T, b); }         \
    static constexpr T min() { return mq_bits(min_); }                           \
    static constexpr T max() { return mq_bits(max_); }                           \
    static constexpr T lowest() { return -max(); }                               \
    static constexpr T epsilon() { return mq_bits(eps_); }                       \
    static constexpr T infinity() { return mq_bits(inf_); }                      \
    static constexpr T quiet_NaN() { return mq_bits(nan_); }                     \
    static constexpr T denorm_min() { return mq_bits(denorm_); }                 \
  };
MQ_FLOAT_LIMITS(float, uint32_t, 24, 0x00800000u, 0x7f7fffffu, 0x34000000u, 0x7f800000u, 0x7fc00000u, 1u)
MQ_FLOAT_LIMITS(half, uint16_t, 11, uint16_t(0x0400), uint16_t(0x7bff), uint16_t(0x1400), uint16_t(0x7c00),
                uint16_t(0x7e00), uint16_t(1))
MQ_FLOAT_LIMITS(bfloat, uint16_t, 8, uint16_t(0x0080), uint16_t(0x7f7f), uint16_t(0x3c00), uint16_t(0x7f80),
                uint16_t(0x7fc0), uint16_t(1))
#undef MQ_FLOAT_LIMITS

}  // namespace metal

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf())
#endif
#define MAXFLOAT 0x1.fffffep+127f
#define HUGE_VALH ((half)__builtin_huge_valf())
#define MAXHALF ((half)0x1.ffcp15f)

#ifndef FLT_MAX
#define FLT_DIG 6
#define FLT_MANT_DIG 24
#define FLT_MAX_10_EXP 38
#define FLT_MAX_EXP 128
#define FLT_MIN_10_EXP (-37)
#define FLT_MIN_EXP (-125)
#define FLT_RADIX 2
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#endif

#define HALF_DIG 2
#define HALF_MANT_DIG 11
#define HALF_MAX_10_EXP 4
#define HALF_MAX_EXP 16
#define HALF_MIN_10_EXP (-4)
#define HALF_MIN_EXP (-13)
#define HALF_RADIX 2
#define HALF_MAX ((half)0x1.ffcp15f)
#define HALF_MIN ((half)0x1p-14f)
#define HALF_EPSILON ((half)0x1p-10f)

#ifndef INT_MAX
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define CHAR_MAX SCHAR_MAX
#define CHAR_MIN SCHAR_MIN
#define USHRT_MAX 65535
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define UINT_MAX 0xffffffffu
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define ULONG_MAX 0xffffffffffffffffUL
#define LONG_MAX 0x7fffffffffffffffL
#define LONG_MIN (-0x7fffffffffffffffL - 1)
#endif

// Math constants as float (_F) and half (_H).
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#define M_E_H ((half)M_E_F)
#define M_LOG2E_H ((half)M_LOG2E_F)
#define M_LOG10E_H ((half)M_LOG10E_F)
#define M_LN2_H ((half)M_LN2_F)
#define M_LN10_H ((half)M_LN10_F)
#define M_PI_H ((half)M_PI_F)
#define M_PI_2_H ((half)M_PI_2_F)
#define M_PI_4_H ((half)M_PI_4_F)
#define M_1_PI_H ((half)M_1_PI_F)
#define M_2_PI_H ((half)M_2_PI_F)
#define M_2_SQRTPI_H ((half)M_2_SQRTPI_F)
#define M_SQRT2_H ((half)M_SQRT2_F)
#define M_SQRT1_2_H ((half)M_SQRT1_2_F)
