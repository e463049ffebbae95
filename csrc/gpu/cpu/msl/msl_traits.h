// metal:: type traits (a minimal set, without <type_traits>, so no std name leaks in)
// and the internal concepts the other headers dispatch on.
#pragma once
#include "msl_scalar.h"

namespace metal {

template <class T, int N>
struct vec;
template <class T, int N>
struct packed_vec;

template <class T, T V>
struct integral_constant {
  static constexpr T value = V;
  using value_type = T;
  using type = integral_constant;
  constexpr operator T() const { return V; }
};
template <bool B>
using bool_constant = integral_constant<bool, B>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;

template <class A, class B>
struct is_same : bool_constant<__is_same(A, B)> {};
template <class A, class B>
inline constexpr bool is_same_v = __is_same(A, B);

template <bool B, class T = void>
struct enable_if {};
template <class T>
struct enable_if<true, T> {
  using type = T;
};
template <bool B, class T = void>
using enable_if_t = typename enable_if<B, T>::type;

template <bool B, class T, class F>
struct conditional {
  using type = T;
};
template <class T, class F>
struct conditional<false, T, F> {
  using type = F;
};
template <bool B, class T, class F>
using conditional_t = typename conditional<B, T, F>::type;

#define MQ_TRAIT_STRIP(name, pattern)   \
  template <class T>                    \
  struct name {                         \
    using type = T;                     \
  };                                    \
  template <class T>                    \
  struct name<pattern> {                \
    using type = T;                     \
  };                                    \
  template <class T>                    \
  using name##_t = typename name<T>::type;
MQ_TRAIT_STRIP(remove_const, const T)
MQ_TRAIT_STRIP(remove_volatile, volatile T)
MQ_TRAIT_STRIP(remove_reference, T&)
MQ_TRAIT_STRIP(remove_pointer, T*)
#undef MQ_TRAIT_STRIP
template <class T>
struct remove_cv {
  using type = remove_volatile_t<remove_const_t<T>>;
};
template <class T>
using remove_cv_t = typename remove_cv<T>::type;

// One value trait per set of types; the _v form is the definition.
#define MQ_TRAIT_VALUE(name, expr)                  \
  template <class T>                                \
  inline constexpr bool name##_v = (expr);          \
  template <class T>                                \
  struct name : bool_constant<name##_v<T>> {};

template <class T, class... U>
inline constexpr bool mq_one_of_v = (__is_same(remove_cv_t<T>, U) || ...);

MQ_TRAIT_VALUE(is_void, (mq_one_of_v<T, void>))
MQ_TRAIT_VALUE(is_floating_point, (mq_one_of_v<T, float, half, bfloat, double>))
MQ_TRAIT_VALUE(is_integral, (mq_one_of_v<T, bool, char, signed char, unsigned char, short, unsigned short, int,
                                         unsigned int, long, unsigned long, long long, unsigned long long>))
MQ_TRAIT_VALUE(is_arithmetic, (is_integral_v<T> || is_floating_point_v<T>))
// char is signed: the runtime compiles with -fsigned-char, as MSL's char is.
MQ_TRAIT_VALUE(is_signed, (is_floating_point_v<T> || mq_one_of_v<T, char, signed char, short, int, long, long long>))
MQ_TRAIT_VALUE(is_unsigned, (is_integral_v<T> && !is_signed_v<T>))
MQ_TRAIT_VALUE(is_scalar, (is_arithmetic_v<T>))
MQ_TRAIT_VALUE(is_const, (!__is_same(T, remove_const_t<T>)))
MQ_TRAIT_VALUE(is_pointer, (!__is_same(T, remove_pointer_t<T>)))
#undef MQ_TRAIT_VALUE

template <class T>
struct is_vector : false_type {};
template <class T, int N>
struct is_vector<vec<T, N>> : true_type {};
template <class T>
inline constexpr bool is_vector_v = is_vector<remove_cv_t<T>>::value;

template <class T>
struct make_unsigned;
template <class T>
struct make_signed;
#define MQ_SIGN_PAIR(S, U)   \
  template <>                \
  struct make_unsigned<S> {  \
    using type = U;          \
  };                         \
  template <>                \
  struct make_unsigned<U> {  \
    using type = U;          \
  };                         \
  template <>                \
  struct make_signed<S> {    \
    using type = S;          \
  };                         \
  template <>                \
  struct make_signed<U> {    \
    using type = S;          \
  };
MQ_SIGN_PAIR(signed char, unsigned char)
MQ_SIGN_PAIR(short, unsigned short)
MQ_SIGN_PAIR(int, unsigned int)
MQ_SIGN_PAIR(long, unsigned long)
MQ_SIGN_PAIR(long long, unsigned long long)
#undef MQ_SIGN_PAIR
template <>
struct make_unsigned<char> {
  using type = unsigned char;
};
template <>
struct make_signed<char> {
  using type = signed char;
};
template <class T>
using make_unsigned_t = typename make_unsigned<T>::type;
template <class T>
using make_signed_t = typename make_signed<T>::type;

template <class T>
T&& declval() noexcept;

// Internal concepts: integers exclude bool (MSL integer functions take no bool).
template <class T>
concept mq_integer = is_integral_v<T> && !__is_same(remove_cv_t<T>, bool);
template <class T>
concept mq_floating = is_floating_point_v<T>;
template <class T>
concept mq_scalar = is_scalar_v<T>;

// Vector shape of a value: N == 0 for scalars; packed vectors count as vectors.
template <class T>
struct mq_shape {
  static constexpr int n = 0;
  using elem = T;
};
template <class T, int N>
struct mq_shape<vec<T, N>> {
  static constexpr int n = N;
  using elem = T;
};
template <class T, int N>
struct mq_shape<packed_vec<T, N>> : mq_shape<vec<T, N>> {};
template <class T>
concept mq_vector = mq_shape<remove_cv_t<remove_reference_t<T>>>::n > 0;

}  // namespace metal
