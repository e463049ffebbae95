// Barriers and fences, and the runtime services every synchronising call goes through.
#pragma once
#include "../abi.h"

// Set by the kernel glue when the runtime binds the library (LibraryExports::bind_runtime).
// Hidden: a default-visibility inline variable becomes a GNU unique symbol, which keeps
// dlclose from ever unloading a compiled library.
__attribute__((visibility("hidden"))) inline const mq_abi::RuntimeApi* mq_runtime = nullptr;

// Code the checking variant must not instrument (-fsanitize=thread): atomics, which may
// race by design, the entry glue, which reads the runtime's launch records, and the hooks.
// clang's no_sanitize("thread") still instruments atomics; its stronger attribute does not.
#if defined(__clang__)
#define MQ_UNCHECKED __attribute__((disable_sanitizer_instrumentation))
#else
#define MQ_UNCHECKED __attribute__((no_sanitize("thread")))
#endif

// Default argument of every synchronising call: evaluated at the caller, so the runtime
// can name the MSL line (the generated C++ keeps #line). Keep it a bare braced list:
// g++ 12 evaluates the builtins at the declaration once they are wrapped in Site{...}.
#define MQ_SITE {__builtin_FILE(), __builtin_LINE()}

// A failure message built without the C library, for mq_runtime->fail (which copies it).
struct mq_message {
  char text[192] = {};
  unsigned len = 0;
  mq_message& operator<<(const char* s) {
    while (*s && len + 1 < sizeof(text)) text[len++] = *s++;
    return *this;
  }
  mq_message& operator<<(unsigned long v) {
    char digits[20];
    int n = 0;
    do digits[n++] = char('0' + v % 10);
    while (v /= 10);
    while (n > 0 && len + 1 < sizeof(text)) text[len++] = digits[--n];
    return *this;
  }
};
[[noreturn]] inline void mq_fail(const mq_message& m) {
  mq_runtime->fail(m.text);
  __builtin_unreachable();  // fail never returns; its pointer type cannot say so portably
}

namespace metal {

// Unscoped, so both mem_flags::mem_device and mem_device compile.
enum mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }
constexpr mem_flags operator&(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) & unsigned(b)); }

enum memory_order : int {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};

enum thread_scope : int {
  thread_scope_thread,
  thread_scope_simdgroup,
  thread_scope_threadgroup,
  thread_scope_device,
};

// Memory needs no flushing on the CPU: a fiber switch is an opaque call, so the
// compiler already reloads shared memory after it.
inline void threadgroup_barrier(mem_flags, mq_abi::Site site = MQ_SITE) { mq_runtime->threadgroup_barrier(site); }

inline void mq_simdgroup_barrier_fn(void* const*) {}
// A collective without data: every live lane of the SIMD-group must reach it.
inline void simdgroup_barrier(mem_flags, mq_abi::Site site = MQ_SITE) {
  char arrived = 0;
  mq_runtime->simd_collective(&mq_simdgroup_barrier_fn, &arrived, site);
}

inline void atomic_thread_fence(mem_flags, memory_order order, thread_scope = thread_scope_device) {
  __atomic_thread_fence(int(order));
}

}  // namespace metal
