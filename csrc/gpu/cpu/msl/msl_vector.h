// MSL vectors: vec<T, N> (N = 2, 3, 4) with MSL's layout, packed_vec<T, N>, and their names.
#pragma once
#include "msl_traits.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#if defined(__clang__)
#pragma GCC diagnostic ignored "-Wgnu-anonymous-struct"
#pragma GCC diagnostic ignored "-Wnested-anon-types"
#endif

namespace metal {

// Layout (MSL): vec<T,2> and vec<T,4> have size and alignment N*sizeof(T); vec<T,3> is
// padded to 4 elements with the same alignment. packed_vec<T,N> is N*sizeof(T), aligned
// as T. The alignment comes from a GCC vector member rather than alignas: clang's
// -fmax-type-align then still caps what it assumes of a pointer.
template <class T, int N, bool Packed, size_t Bytes = sizeof(T) * (N == 3 ? 4 : N)>
struct mq_align_carrier {
  typedef unsigned char type __attribute__((vector_size(Bytes)));
};
// 32-byte vectors align 32 only with AVX; MSL's long4 always does. (GCC drops the
// attribute on a typedef declared inside a template, hence the namespace-scope one; being
// explicit, this alignment is not capped by clang's -fmax-type-align.)
typedef unsigned char mq_align32_t __attribute__((vector_size(32), aligned(32)));
template <class T, int N>
struct mq_align_carrier<T, N, false, 32> {
  typedef mq_align32_t type;
};
template <class T, int N, size_t Bytes>
struct mq_align_carrier<T, N, true, Bytes> {
  typedef T type;
};

template <class T, int N, bool Packed>
struct mq_vec_storage;
template <class T, bool Packed>
struct mq_vec_storage<T, 2, Packed> {
  union {
    T e[2];
    struct { T x, y; };
    struct { T r, g; };
    typename mq_align_carrier<T, 2, Packed>::type mq_align;
  };
};
template <class T, bool Packed>
struct mq_vec_storage<T, 3, Packed> {
  union {
    T e[Packed ? 3 : 4];
    struct { T x, y, z; };
    struct { T r, g, b; };
    typename mq_align_carrier<T, 3, Packed>::type mq_align;
  };
};
template <class T, bool Packed>
struct mq_vec_storage<T, 4, Packed> {
  union {
    T e[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    typename mq_align_carrier<T, 4, Packed>::type mq_align;
  };
};

// Number of components an argument of a vector constructor supplies.
template <class A>
inline constexpr int mq_components_v = mq_shape<A>::n == 0 ? 1 : mq_shape<A>::n;

// The lvalue a multi-letter swizzle becomes on the left of an assignment
// (`v.yx += d` -> `v.template mq_swz_ref<1, 0>() += d`).
template <class V, int... I>
struct mq_swizzle_ref {
  using T = typename mq_shape<V>::elem;
  using value_type = vec<T, int(sizeof...(I))>;
  static_assert(((I >= 0 && I < mq_shape<V>::n) && ...), "swizzle component out of range");

  V& v;

  value_type get() const {
    V s = v;
    return value_type(s.e[I]...);
  }
  void set(value_type x) {
    constexpr int idx[] = {I...};
    static_assert([] {
      for (int i = 0; i < int(sizeof...(I)); i++)
        for (int j = 0; j < i; j++)
          if (idx[i] == idx[j]) return false;
      return true;
    }(), "a swizzle assigned to may not repeat a component");
    V s = v;
    for (int k = 0; k < int(sizeof...(I)); k++) s.e[idx[k]] = x.e[k];
    v = s;
  }
  operator value_type() const { return get(); }
  mq_swizzle_ref& operator=(value_type x) {
    set(x);
    return *this;
  }
  mq_swizzle_ref& operator=(const mq_swizzle_ref& o) {
    set(o.get());
    return *this;
  }
#define MQ_SWIZZLE_COMPOUND(op)                           \
  mq_swizzle_ref& operator op##=(value_type x) {         \
    value_type c = get();                                 \
    c op## = x;                                           \
    set(c);                                               \
    return *this;                                         \
  }
  MQ_SWIZZLE_COMPOUND(+)
  MQ_SWIZZLE_COMPOUND(-)
  MQ_SWIZZLE_COMPOUND(*)
  MQ_SWIZZLE_COMPOUND(/)
  MQ_SWIZZLE_COMPOUND(%)
  MQ_SWIZZLE_COMPOUND(&)
  MQ_SWIZZLE_COMPOUND(|)
  MQ_SWIZZLE_COMPOUND(^)
  MQ_SWIZZLE_COMPOUND(<<)
  MQ_SWIZZLE_COMPOUND(>>)
#undef MQ_SWIZZLE_COMPOUND
};

// Members shared by vec and packed_vec. Copies go through memcpy from an address
// laundered through an integer: kernels cast under-aligned device pointers to float4*
// (Apple GPUs accept that), and a plain struct copy would use aligned SSE moves. For the
// same reason every function here takes vectors by value: elements are then read from an
// aligned copy, never through a reference the optimizer may assume aligned.
#define MQ_VEC_MEMBERS(Self)                                                           \
  using value_type = T;                                                                \
  Self() = default;                                                                    \
  constexpr Self(const Self& o) { mq_copy(o); }                                        \
  constexpr Self& operator=(const Self& o) {                                           \
    mq_copy(o);                                                                        \
    return *this;                                                                      \
  }                                                                                    \
  constexpr T& operator[](size_t i) { return this->e[i]; }                             \
  constexpr const T& operator[](size_t i) const { return this->e[i]; }                 \
  template <int... I>                                                                  \
  constexpr vec<T, int(sizeof...(I))> mq_swz() const {                                 \
    Self s = *this;                                                                    \
    return vec<T, int(sizeof...(I))>(s.e[I]...);                                       \
  }                                                                                    \
  template <int... I>                                                                  \
  mq_swizzle_ref<Self, I...> mq_swz_ref() {                                            \
    return {*this};                                                                    \
  }                                                                                    \
  constexpr void mq_copy(const Self& o) {                                              \
    if (__builtin_is_constant_evaluated()) {                                           \
      for (size_t i = 0; i < sizeof(this->e) / sizeof(T); i++)                         \
        this->e[i] = i < N ? o.e[i] : T();                                             \
    } else {                                                                           \
      __builtin_memcpy(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(this)),     \
                       reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(&o)), \
                       N * sizeof(T));                                                 \
    }                                                                                  \
  }

template <class T, int N>
struct vec : mq_vec_storage<T, N, false> {
  static_assert(N >= 2 && N <= 4, "MSL vectors have 2, 3 or 4 components");
  MQ_VEC_MEMBERS(vec)
  using mq_mask = vec<bool, N>;

  // A scalar of any type broadcasts implicitly (`float4 s4 = s;`, `half4 h = 0.0h;`).
  template <class S>
    requires is_scalar_v<S>
  constexpr vec(S s) {
    for (int i = 0; i < N; i++) this->e[i] = T(s);
    mq_clear_pad();
  }
  // Component lists mixing scalars and vectors: float4(a, b, c, d), float4(xy, zw), float3(xy, z).
  template <class A, class B, class... R>
    requires(mq_components_v<A> + mq_components_v<B> + (0 + ... + mq_components_v<R>) == N)
  constexpr vec(A a, B b, R... r) {
    int i = 0;
    mq_put(i, a);
    mq_put(i, b);
    (mq_put(i, r), ...);
    mq_clear_pad();
  }
  // Element type conversions are explicit, as in MSL: float4(uchar4), half4(float4).
  template <class U>
    requires(!__is_same(U, T))
  constexpr explicit vec(vec<U, N> o) {
    for (int i = 0; i < N; i++) this->e[i] = T(o.e[i]);
    mq_clear_pad();
  }
  template <class U>
  constexpr explicit(!__is_same(U, T)) vec(packed_vec<U, N> o) {
    for (int i = 0; i < N; i++) this->e[i] = T(o.e[i]);
    mq_clear_pad();
  }

  // Elementwise operators; a scalar operand converts to T through the broadcast constructor.
#define MQ_VEC_BINARY(op, ok)                                           \
  friend constexpr vec operator op(vec a, vec b)                        \
    requires(ok)                                                        \
  {                                                                     \
    vec r;                                                              \
    for (int i = 0; i < N; i++) r.e[i] = T(a.e[i] op b.e[i]);           \
    return r;                                                           \
  }                                                                     \
  constexpr vec& operator op##=(vec b)                                  \
    requires(ok)                                                        \
  {                                                                     \
    return *this = *this op b;                                          \
  }
  MQ_VEC_BINARY(+, !__is_same(T, bool))
  MQ_VEC_BINARY(-, !__is_same(T, bool))
  MQ_VEC_BINARY(*, !__is_same(T, bool))
  MQ_VEC_BINARY(/, !__is_same(T, bool))
  MQ_VEC_BINARY(%, mq_integer<T>)
  MQ_VEC_BINARY(&, is_integral_v<T>)
  MQ_VEC_BINARY(|, is_integral_v<T>)
  MQ_VEC_BINARY(^, is_integral_v<T>)
  MQ_VEC_BINARY(<<, mq_integer<T>)
  MQ_VEC_BINARY(>>, mq_integer<T>)
#undef MQ_VEC_BINARY

#define MQ_VEC_RELATION(op)                                                 \
  friend constexpr vec<bool, N> operator op(vec a, vec b) {                 \
    vec<bool, N> r;                                                         \
    for (int i = 0; i < N; i++) r.e[i] = bool(a.e[i] op b.e[i]);            \
    return r;                                                               \
  }
  MQ_VEC_RELATION(==)
  MQ_VEC_RELATION(!=)
  MQ_VEC_RELATION(<)
  MQ_VEC_RELATION(<=)
  MQ_VEC_RELATION(>)
  MQ_VEC_RELATION(>=)
  MQ_VEC_RELATION(&&)
  MQ_VEC_RELATION(||)
#undef MQ_VEC_RELATION

#define MQ_VEC_UNARY(op, R, ok)                                  \
  friend constexpr R operator op(vec a)                          \
    requires(ok)                                                 \
  {                                                              \
    R r;                                                         \
    for (int i = 0; i < N; i++) r.e[i] = op a.e[i];              \
    return r;                                                    \
  }
  MQ_VEC_UNARY(+, vec, !__is_same(T, bool))
  MQ_VEC_UNARY(-, vec, !__is_same(T, bool))
  MQ_VEC_UNARY(~, vec, mq_integer<T>)
  MQ_VEC_UNARY(!, mq_mask, true)
#undef MQ_VEC_UNARY

  constexpr vec& operator++() { return *this += T(1); }
  constexpr vec& operator--() { return *this -= T(1); }
  constexpr vec operator++(int) {
    vec old = *this;
    *this += T(1);
    return old;
  }
  constexpr vec operator--(int) {
    vec old = *this;
    *this -= T(1);
    return old;
  }

 private:
  template <class A>
  constexpr void mq_put(int& i, A a) {
    if constexpr (mq_shape<A>::n == 0) {
      this->e[i++] = T(a);
    } else {
      for (int k = 0; k < mq_shape<A>::n; k++) this->e[i++] = T(a.e[k]);
    }
  }
  constexpr void mq_clear_pad() {
    if constexpr (N == 3) this->e[3] = T();  // deterministic padding bytes (and constexpr-complete)
  }
};

template <class T, int N>
struct packed_vec : mq_vec_storage<T, N, true> {
  static_assert(N >= 2 && N <= 4, "MSL vectors have 2, 3 or 4 components");
  MQ_VEC_MEMBERS(packed_vec)

  constexpr packed_vec(vec<T, N> v) {
    for (int i = 0; i < N; i++) this->e[i] = v.e[i];
  }
  template <class A, class B, class... R>
    requires requires(A a, B b, R... r) { vec<T, N>(a, b, r...); }
  constexpr packed_vec(const A& a, const B& b, const R&... r) : packed_vec(vec<T, N>(a, b, r...)) {}

  // Arithmetic on packed vectors yields vec, as reading one into a register would.
#define MQ_PACKED_BINARY(op)                                                                  \
  friend constexpr auto operator op(packed_vec a, vec<T, N> b) { return vec<T, N>(a) op b; } \
  friend constexpr auto operator op(vec<T, N> a, packed_vec b) { return a op vec<T, N>(b); } \
  friend constexpr auto operator op(packed_vec a, packed_vec b) { return vec<T, N>(a) op vec<T, N>(b); }
  MQ_PACKED_BINARY(+)
  MQ_PACKED_BINARY(-)
  MQ_PACKED_BINARY(*)
  MQ_PACKED_BINARY(/)
  MQ_PACKED_BINARY(==)
  MQ_PACKED_BINARY(!=)
  MQ_PACKED_BINARY(<)
  MQ_PACKED_BINARY(<=)
  MQ_PACKED_BINARY(>)
  MQ_PACKED_BINARY(>=)
#undef MQ_PACKED_BINARY
};
#undef MQ_VEC_MEMBERS

#define MQ_VEC_NAMES(T, name)                \
  typedef vec<T, 2> name##2;                 \
  typedef vec<T, 3> name##3;                 \
  typedef vec<T, 4> name##4;                 \
  typedef packed_vec<T, 2> packed_##name##2; \
  typedef packed_vec<T, 3> packed_##name##3; \
  typedef packed_vec<T, 4> packed_##name##4;
MQ_VEC_NAMES(bool, bool)
MQ_VEC_NAMES(char, char)
MQ_VEC_NAMES(uchar, uchar)
MQ_VEC_NAMES(short, short)
MQ_VEC_NAMES(ushort, ushort)
MQ_VEC_NAMES(int, int)
MQ_VEC_NAMES(uint, uint)
MQ_VEC_NAMES(long, long)
MQ_VEC_NAMES(ulong, ulong)
MQ_VEC_NAMES(half, half)
MQ_VEC_NAMES(float, float)
MQ_VEC_NAMES(bfloat, bfloat)
#undef MQ_VEC_NAMES

}  // namespace metal

#define MQ_VEC_EXPORT(name)               \
  using metal::name##2;                   \
  using metal::name##3;                   \
  using metal::name##4;                   \
  using metal::packed_##name##2;          \
  using metal::packed_##name##3;          \
  using metal::packed_##name##4;
MQ_VEC_EXPORT(bool)
MQ_VEC_EXPORT(char)
MQ_VEC_EXPORT(uchar)
MQ_VEC_EXPORT(short)
MQ_VEC_EXPORT(ushort)
MQ_VEC_EXPORT(int)
MQ_VEC_EXPORT(uint)
MQ_VEC_EXPORT(long)
MQ_VEC_EXPORT(ulong)
MQ_VEC_EXPORT(half)
MQ_VEC_EXPORT(float)
MQ_VEC_EXPORT(bfloat)
#undef MQ_VEC_EXPORT

#pragma GCC diagnostic pop
