// The checking variant of a library is compiled with -fsanitize=thread but linked without
// the sanitizer's runtime: these definitions of its entry points forward every instrumented
// load and store of the kernel to the CPU runtime's race and bounds checker (abi.h
// RuntimeApi::check_access). g++ and clang emit the sized and range forms; clang also turns
// memset/memcpy/memmove into the __tsan_mem* calls, which must then do the copy themselves.
#pragma once
#include "msl_sync.h"

#define MQ_HOOK extern "C" __attribute__((visibility("hidden"), noinline)) MQ_UNCHECKED

// The caller's address is the instrumented instruction; the checker maps it to an MSL line.
#define MQ_CHECK(address, size, kind) \
  mq_runtime->check_access(address, size, mq_abi::AccessKind::kind, __builtin_return_address(0))

#define MQ_SIZED_HOOKS(n)                                                                    \
  MQ_HOOK void __tsan_read##n(const void* p) { MQ_CHECK(p, n, read); }                       \
  MQ_HOOK void __tsan_write##n(const void* p) { MQ_CHECK(p, n, write); }                     \
  MQ_HOOK void __tsan_unaligned_read##n(const void* p) { MQ_CHECK(p, n, read); }             \
  MQ_HOOK void __tsan_unaligned_write##n(const void* p) { MQ_CHECK(p, n, write); }
MQ_SIZED_HOOKS(1)
MQ_SIZED_HOOKS(2)
MQ_SIZED_HOOKS(4)
MQ_SIZED_HOOKS(8)
MQ_SIZED_HOOKS(16)
#undef MQ_SIZED_HOOKS

MQ_HOOK void __tsan_read_range(const void* p, unsigned long n) { MQ_CHECK(p, n, read); }
MQ_HOOK void __tsan_write_range(const void* p, unsigned long n) { MQ_CHECK(p, n, write); }

MQ_HOOK void* __tsan_memset(void* p, int value, unsigned long n) {
  MQ_CHECK(p, n, write);
  return __builtin_memset(p, value, n);
}
MQ_HOOK void* __tsan_memcpy(void* to, const void* from, unsigned long n) {
  MQ_CHECK(from, n, read);
  MQ_CHECK(to, n, write);
  return __builtin_memcpy(to, from, n);
}
MQ_HOOK void* __tsan_memmove(void* to, const void* from, unsigned long n) {
  MQ_CHECK(from, n, read);
  MQ_CHECK(to, n, write);
  return __builtin_memmove(to, from, n);
}

// Call-stack tracking and start-up: the checker needs neither.
MQ_HOOK void __tsan_init() {}
MQ_HOOK void __tsan_func_entry(void*) {}
MQ_HOOK void __tsan_func_exit() {}

#undef MQ_CHECK
#undef MQ_HOOK
