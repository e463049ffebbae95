// MSL scalar types in C++: the integer names, half (_Float16) and bfloat.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The same typedefs glibc's <sys/types.h> makes, so both may be seen together.
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;  // 64-bit on LP64, like MSL's ulong (long is already 64-bit)
// GCC >= 12 rounds every _Float16 operation to half, as a GPU does; clang does when
// given -ffloat16-excess-precision=none (toolchain.cpp passes it).
typedef _Float16 half;

struct bfloat;

template <class T>
inline constexpr bool mq_is_builtin_arith_v = false;
#define MQ_BUILTIN_ARITH(T) \
  template <>               \
  inline constexpr bool mq_is_builtin_arith_v<T> = true;
MQ_BUILTIN_ARITH(bool)
MQ_BUILTIN_ARITH(char)
MQ_BUILTIN_ARITH(signed char)
MQ_BUILTIN_ARITH(unsigned char)
MQ_BUILTIN_ARITH(short)
MQ_BUILTIN_ARITH(unsigned short)
MQ_BUILTIN_ARITH(int)
MQ_BUILTIN_ARITH(unsigned int)
MQ_BUILTIN_ARITH(long)
MQ_BUILTIN_ARITH(unsigned long)
MQ_BUILTIN_ARITH(long long)
MQ_BUILTIN_ARITH(unsigned long long)
MQ_BUILTIN_ARITH(half)
MQ_BUILTIN_ARITH(float)
MQ_BUILTIN_ARITH(double)
#undef MQ_BUILTIN_ARITH

template <class T>
concept mq_builtin_arith = mq_is_builtin_arith_v<T>;

// float -> bfloat bits, round to nearest even; NaN keeps its sign and top payload, made quiet.
constexpr uint16_t mq_bfloat_bits(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bfloat: the top 16 bits of a float. Arithmetic runs in float and rounds back, which
// is correctly rounded for + - * / (float's 24 significand bits are at least 2*8+2).
struct bfloat {
  uint16_t mq_bits;

  bfloat() = default;
  template <mq_builtin_arith S>
  constexpr bfloat(S s) : mq_bits(mq_bfloat_bits(float(s))) {}
  constexpr operator float() const { return __builtin_bit_cast(float, uint32_t(mq_bits) << 16); }
  static constexpr bfloat mq_from_bits(uint16_t bits) {
    bfloat b{};
    b.mq_bits = bits;
    return b;
  }

  constexpr bfloat operator+() const { return *this; }
  constexpr bfloat operator-() const { return mq_from_bits(uint16_t(mq_bits ^ 0x8000u)); }
  constexpr bfloat& operator++() { return *this = bfloat(float(*this) + 1.0f); }
  constexpr bfloat& operator--() { return *this = bfloat(float(*this) - 1.0f); }
  constexpr bfloat operator++(int) {
    bfloat old = *this;
    ++*this;
    return old;
  }
  constexpr bfloat operator--(int) {
    bfloat old = *this;
    --*this;
    return old;
  }
};

template <class T>
concept mq_bfloat_operand = mq_builtin_arith<T> || __is_same(T, bfloat);

// Mixed operations promote like MSL: bfloat with an integer or bfloat stays bfloat,
// bfloat with float (or half, or a double literal) becomes float.
template <class A, class B>
concept mq_bfloat_pair = (__is_same(A, bfloat) || __is_same(B, bfloat)) && mq_bfloat_operand<A> &&
                         mq_bfloat_operand<B>;

template <class T>
inline constexpr bool mq_promotes_bfloat_v = __is_same(T, float) || __is_same(T, double) || __is_same(T, half);
template <bool ToFloat>
struct mq_bfloat_result {
  using type = bfloat;
};
template <>
struct mq_bfloat_result<true> {
  using type = float;
};
template <class A, class B>
using mq_bfloat_result_t = typename mq_bfloat_result<mq_promotes_bfloat_v<A> || mq_promotes_bfloat_v<B>>::type;

// Exact-match templates: they win over the built-in operators reached through
// bfloat's conversions, which would otherwise make every mixed expression ambiguous.
#define MQ_BFLOAT_ARITH(op)                                                     \
  template <class A, class B>                                                   \
    requires mq_bfloat_pair<A, B>                                               \
  constexpr mq_bfloat_result_t<A, B> operator op(A a, B b) {                    \
    using R = mq_bfloat_result_t<A, B>;                                         \
    return R(float(R(a)) op float(R(b)));                                       \
  }                                                                             \
  template <mq_bfloat_operand B>                                                \
  constexpr bfloat& operator op##=(bfloat & a, B b) {                           \
    return a = bfloat(a op b);                                                  \
  }
MQ_BFLOAT_ARITH(+)
MQ_BFLOAT_ARITH(-)
MQ_BFLOAT_ARITH(*)
MQ_BFLOAT_ARITH(/)
#undef MQ_BFLOAT_ARITH

#define MQ_BFLOAT_COMPARE(op)                                  \
  template <class A, class B>                                  \
    requires mq_bfloat_pair<A, B>                              \
  constexpr bool operator op(A a, B b) {                       \
    using R = mq_bfloat_result_t<A, B>;                        \
    return float(R(a)) op float(R(b));                         \
  }
MQ_BFLOAT_COMPARE(==)
MQ_BFLOAT_COMPARE(!=)
MQ_BFLOAT_COMPARE(<)
MQ_BFLOAT_COMPARE(<=)
MQ_BFLOAT_COMPARE(>)
MQ_BFLOAT_COMPARE(>=)
#undef MQ_BFLOAT_COMPARE

namespace metal {
using ::bfloat;
using ::half;
using ::size_t;
using ::ptrdiff_t;
using ::uchar;
using ::uint;
using ::ulong;
using ::ushort;
}  // namespace metal
