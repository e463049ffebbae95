// The contract between the CPU runtime and the kernels it compiles from MSL.
// Included by the runtime (C++) and by the MSL compatibility header, so it uses
// plain C++ types only and no standard library.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace mq_abi {

constexpr unsigned kSimdWidth = 32;
constexpr unsigned kMaxBufferIndex = 31;  // Metal's buffer argument table size
constexpr unsigned kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kMaxThreadgroupMemory = 32 * 1024;
constexpr size_t kMaxSetBytes = 4 * 1024;

struct Dim3 {
  uint32_t x, y, z;
};

// Values of the position builtins for one GPU thread.
struct ThreadIds {
  Dim3 thread_position_in_grid;
  Dim3 thread_position_in_threadgroup;
  Dim3 threadgroup_position_in_grid;
  Dim3 threads_per_threadgroup;  // this group's real size (edge groups may be partial)
  uint32_t thread_index_in_threadgroup;
  uint32_t thread_index_in_simdgroup;
  uint32_t simdgroup_index_in_threadgroup;
  uint32_t simdgroups_per_threadgroup;
  uint32_t threads_per_simdgroup;  // always 32 (the SIMD width), also in a partial SIMD-group
};

// Values shared by every thread of one dispatch.
struct Launch {
  void* buffers[kMaxBufferIndex];         // base + offset of each bound argument
  void* threadgroup_buffers[kMaxBufferIndex];  // [[threadgroup(n)]] arguments
  Dim3 threadgroups_per_grid;
  Dim3 threads_per_grid;
  Dim3 dispatch_threads_per_threadgroup;  // the size the dispatch asked for
};

// A SIMD-group collective: every live lane passes a pointer to its own data;
// once all live lanes arrive at the same call site, the runtime calls `fn`
// once with the 32 lane pointers (nullptr for lanes that exited or do not exist).
using CollectiveFn = void (*)(void* const lanes[kSimdWidth]);

// Where a synchronising call stands in the MSL source (from #line).
struct Site {
  const char* file;
  unsigned line;
};

enum class AccessKind : uint32_t { read, write };

// Services the runtime gives compiled kernels (bound once per loaded library).
struct RuntimeApi {
  void (*simd_collective)(CollectiveFn fn, void* lane_data, Site site);
  void (*threadgroup_barrier)(Site site);
  // Threadgroup memory for declaration `site_key` of the running kernel: the
  // same address for every thread of a group, filled with NaN before the group.
  // The key is a unique object per declaration holding the variable's name (a C string).
  void* (*threadgroup_alloc)(const void* site_key, size_t size, size_t align);
  // Stops the dispatch with this message (raised from CommandBuffer::wait); never returns.
  // Only a kernel's own thread may call it, never a CollectiveFn. The pointer type is
  // not noreturn: clang does not convert a lambda to one (callers add unreachable).
  void (*fail)(const char* message);
  // Notes that the calling lane ran the SIMD-group function `name` at `site` without waiting
  // for its SIMD-group (simdgroup_load/store); the runtime checks that every lane ran the same
  // ones when the SIMD-group next waits. Returns the lane's index in its SIMD-group.
  uint32_t (*simd_lane_op)(const char* name, Site site);
  // Checking variant only (msl/mq_access_hooks.h): the running thread is about to read or
  // write `size` bytes at `address`; `pc` is the kernel instruction doing it. May call fail.
  void (*check_access)(const void* address, size_t size, AccessKind kind, const void* pc);
};

enum class ParamKind : uint32_t {
  buffer_pointer,    // device/constant T* [[buffer(n)]]
  buffer_reference,  // device/constant T& [[buffer(n)]]: at least `bytes` bytes must be bound
  threadgroup_pointer,  // threadgroup T* [[threadgroup(n)]]
};

struct ParamInfo {
  const char* name;
  ParamKind kind;
  uint32_t index;
  uint32_t bytes;  // sizeof(T)
  uint32_t read_only;  // const device / constant: the kernel does not write through it
};

using KernelEntry = void (*)(const Launch* launch, const ThreadIds* ids);

struct KernelInfo {
  const char* name;
  KernelEntry entry;
  uint32_t max_total_threads_per_threadgroup;  // [[max_total_threads_per_threadgroup]] or 1024
  uint32_t param_count;
  const ParamInfo* params;
  const char* file;  // where the kernel is defined, for messages
  unsigned line;
};

// Symbols every compiled library exports (extern "C").
struct LibraryExports {
  uint32_t abi_version;
  uint32_t kernel_count;
  const KernelInfo* kernels;
  void (*bind_runtime)(const RuntimeApi* api);
};

constexpr uint32_t kAbiVersion = 3;
constexpr const char* kExportsSymbol = "mq_library_exports";

}  // namespace mq_abi
