// Glue between translated MSL and the CPU runtime: address spaces, argument
// binding for the generated entry points, threadgroup memory.
#pragma once
#include "../abi.h"

// Code that checks for MSL (shared headers such as shaders/params.h) sees MSL 3.1;
// the preprocessing pass (msl_preprocess.cpp) defines the same value.
#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 310
#endif

// Address spaces are all plain memory on the CPU; `constant` data is read-only.
#define device
#define thread
#define threadgroup
#define constant const

template <class T> struct mq_glue_pointee { using type = T; };
template <class T> struct mq_glue_pointee<T&> { using type = T; };
template <class T> using mq_glue_pointee_t = typename mq_glue_pointee<T>::type;

// Whether a buffer argument's type lets the kernel write through it (`constant` is const here).
template <class T> struct mq_glue_pointer_target { using type = mq_glue_pointee_t<T>; };
template <class T> struct mq_glue_pointer_target<T*> { using type = T; };
template <class T>
constexpr uint32_t mq_glue_read_only = metal::is_const_v<typename mq_glue_pointer_target<T>::type> ? 1 : 0;

// Parameter I of function type F: the argument types of a `decltype(f<...>) f<...>` instance.
template <unsigned I, class... P> struct mq_glue_nth;
template <class T, class... P> struct mq_glue_nth<0, T, P...> { using type = T; };
template <unsigned I, class T, class... P> struct mq_glue_nth<I, T, P...> : mq_glue_nth<I - 1, P...> {};
template <class F, unsigned I> struct mq_glue_param;
template <class R, class... P, unsigned I> struct mq_glue_param<R(P...), I> : mq_glue_nth<I, P...> {};
template <class F, unsigned I> using mq_glue_param_t = typename mq_glue_param<F, I>::type;

// Binds a `constant T& p [[buffer(n)]]` argument.
template <class R> inline R mq_glue_ref(void* p) { return *static_cast<mq_glue_pointee_t<R>*>(p); }

// Converts a position builtin to the parameter's declared type (uint, ushort2, uint3 ...).
template <class T> inline T mq_glue_builtin(uint32_t v) { return T(v); }
template <class T> inline T mq_glue_builtin(mq_abi::Dim3 d) {
  if constexpr (requires { T(d.x, d.y, d.z); }) return T(d.x, d.y, d.z);
  else if constexpr (requires { T(d.x, d.y); }) return T(d.x, d.y);
  else return T(d.x);
}

// Shared memory of the running threadgroup for one declaration site.
inline void* mq_tg_alloc(const void* site_key, size_t size, size_t align) {
  return mq_runtime->threadgroup_alloc(site_key, size, align);
}

// The library keeps its own copy of the services, so the checking mode sees kernels read
// only their own image. Unchecked: it runs at load, before the hooks have a runtime to call.
__attribute__((visibility("hidden"))) inline mq_abi::RuntimeApi mq_runtime_copy{};
static MQ_UNCHECKED void mq_glue_bind_runtime(const mq_abi::RuntimeApi* api) {
  mq_runtime_copy = *api;
  mq_runtime = &mq_runtime_copy;
}

#if MQ_CHECK_ACCESSES
#include "mq_access_hooks.h"
#endif
