// Scalar and vector types of MSL for both passes of the strict check; the including
// metal_stdlib has defined the address spaces (device, constant, threadgroup, thread).
#pragma once

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef decltype(sizeof(0)) size_t;
typedef decltype((int*)0 - (int*)0) ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
#ifndef __OPENCL_CPP_VERSION__  // OpenCL's half is built in (cl_khr_fp16), as clang's __fp16
typedef _Float16 half;
#endif

// Half literals (1.5h; the check turns 1.5H into 1.5h).
half operator"" h(long double);
half operator"" h(unsigned long long);

// Metal has no double (floating-point literals without a suffix are still accepted).
typedef double mq_strict_double __attribute__((unavailable("Metal has no double; use float")));
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wkeyword-macro"
#define double mq_strict_double
// C++ that MSL leaves out (the MSL specification's "Restrictions" section); exceptions and
// RTTI are off by compiler flag (msl_check.cpp).
#define MQ_STRICT_UNSUPPORTED(what) _Pragma(MQ_STRICT_STRING(GCC error what " are not supported in Metal"))
#define MQ_STRICT_STRING(text) #text
#define virtual MQ_STRICT_UNSUPPORTED("virtual functions")
#define goto MQ_STRICT_UNSUPPORTED("goto statements")
#define new MQ_STRICT_UNSUPPORTED("new expressions")
#define thread_local MQ_STRICT_UNSUPPORTED("thread_local variables")
#define register MQ_STRICT_UNSUPPORTED("register variables")
#pragma clang diagnostic pop

// bfloat (MSL 3.1) as a 2-byte type distinct from half (clang 14/16 have no arithmetic
// __bf16): clang's __fp16, whose arithmetic happens in float; OpenCL's half is __fp16.
#ifdef __OPENCL_CPP_VERSION__
typedef _Float16 bfloat;
#else
typedef __fp16 bfloat;
#endif

// Metal's bool2..4 are left out: clang 14/16 have no bool ext_vector_type. Packed vectors
// differ only in alignment, which a syntax check does not see: they are the same types.
#define MQ_STRICT_VECTORS(T)                             \
  typedef T T##2 __attribute__((ext_vector_type(2)));    \
  typedef T T##3 __attribute__((ext_vector_type(3)));    \
  typedef T T##4 __attribute__((ext_vector_type(4)));    \
  typedef T##2 packed_##T##2;                            \
  typedef T##3 packed_##T##3;                            \
  typedef T##4 packed_##T##4;
MQ_STRICT_VECTORS(char)
MQ_STRICT_VECTORS(uchar)
MQ_STRICT_VECTORS(short)
MQ_STRICT_VECTORS(ushort)
MQ_STRICT_VECTORS(int)
MQ_STRICT_VECTORS(uint)
MQ_STRICT_VECTORS(long)
MQ_STRICT_VECTORS(ulong)
MQ_STRICT_VECTORS(half)
MQ_STRICT_VECTORS(float)
MQ_STRICT_VECTORS(bfloat)
#undef MQ_STRICT_VECTORS

namespace metal {
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;
template <class T> struct mq_scalar_of { typedef T type; enum { size = 1, arithmetic = 0, floating = 0 }; };
#define MQ_STRICT_SCALAR(T, FLOATING)                                                                  \
  template <> struct mq_scalar_of<T> { typedef T type; enum { size = 1, arithmetic = 1, floating = FLOATING }; };   \
  template <> struct mq_scalar_of<T##2> { typedef T type; enum { size = 2, arithmetic = 1, floating = FLOATING }; }; \
  template <> struct mq_scalar_of<T##3> { typedef T type; enum { size = 3, arithmetic = 1, floating = FLOATING }; }; \
  template <> struct mq_scalar_of<T##4> { typedef T type; enum { size = 4, arithmetic = 1, floating = FLOATING }; };
template <> struct mq_scalar_of<bool> { typedef bool type; enum { size = 1, arithmetic = 1, floating = 0 }; };
MQ_STRICT_SCALAR(char, 0)
MQ_STRICT_SCALAR(uchar, 0)
MQ_STRICT_SCALAR(short, 0)
MQ_STRICT_SCALAR(ushort, 0)
MQ_STRICT_SCALAR(int, 0)
MQ_STRICT_SCALAR(uint, 0)
MQ_STRICT_SCALAR(long, 0)
MQ_STRICT_SCALAR(ulong, 0)
MQ_STRICT_SCALAR(half, 1)
MQ_STRICT_SCALAR(float, 1)
MQ_STRICT_SCALAR(bfloat, 1)
#undef MQ_STRICT_SCALAR
template <> struct mq_scalar_of<signed char> { typedef signed char type; enum { size = 1, arithmetic = 1, floating = 0 }; };
template <class T> using mq_scalar_t = typename mq_scalar_of<T>::type;

// Vector construction: the check rewrites `float4(a, b)` to `mq_make_float4(a, b)`
// (C++ has no multi-argument cast to a vector); the components must add up.
template <class... A> struct mq_components { enum { value = 0 }; };
template <class A, class... R> struct mq_components<A, R...> {
  enum { value = mq_scalar_of<A>::arithmetic ? int(mq_scalar_of<A>::size) + int(mq_components<R...>::value) : -64 };
};
template <class V, class... A> struct mq_vector_args {
  enum { count = mq_components<A...>::value, size = mq_scalar_of<V>::size };
  enum { value = count == size || (sizeof...(A) == 1 && count == 1) };
};
}  // namespace metal

// A call with the wrong component count fails at the .metal line ("no matching function").
#define MQ_STRICT_MAKER(V) template <class... A> metal::enable_if_t<metal::mq_vector_args<V, A...>::value, V> mq_make_##V(A...);
#define MQ_STRICT_MAKERS(T) MQ_STRICT_MAKER(T##2) MQ_STRICT_MAKER(T##3) MQ_STRICT_MAKER(T##4)
MQ_STRICT_MAKERS(char)
MQ_STRICT_MAKERS(uchar)
MQ_STRICT_MAKERS(short)
MQ_STRICT_MAKERS(ushort)
MQ_STRICT_MAKERS(int)
MQ_STRICT_MAKERS(uint)
MQ_STRICT_MAKERS(long)
MQ_STRICT_MAKERS(ulong)
MQ_STRICT_MAKERS(half)
MQ_STRICT_MAKERS(float)
MQ_STRICT_MAKERS(bfloat)
#undef MQ_STRICT_MAKERS
#undef MQ_STRICT_MAKER

// Threadgroup variables of a kernel refer to this (msl_strict_source.h): never constructed.
template <class T> T& mq_threadgroup_variable();

// A kernel's return type T is written mq_kernel_result<T, sizeof(mq_kernel_must_return_void<T>)>
// (msl_strict_source.h): complete for void, and for the function type returning void of an
// instantiation through decltype; any other fails at the kernel's line.
template <class T> struct mq_kernel_must_return_void;
template <> struct mq_kernel_must_return_void<void> {};
template <class... A> struct mq_kernel_must_return_void<void(A...)> {};
template <class T, decltype(sizeof(0))> using mq_kernel_result = T;

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 3.40282347e+38f
#define FLT_MAX 3.40282347e+38f
#define FLT_MIN 1.17549435e-38f
#define FLT_EPSILON 1.1920929e-07f
#define HALF_MAX ((half)65504.0f)
#define M_PI_F 3.14159265f
#define M_LOG2E_F 1.44269504f
#define M_LN2_F 0.69314718f
#define M_SQRT2_F 1.41421356f
