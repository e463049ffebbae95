// The one GPU interface of metalqwen: Metal on Apple GPUs, the CPU runtime elsewhere.
// Plain C++ only: no Objective-C type may appear here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mq::gpu {

// Every GPU failure; messages start with a [component] prefix.
class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// MSL that did not compile; `diagnostics` holds the compiler's own output.
class CompileError : public GpuError {
 public:
  CompileError(const std::string& message, std::string diagnostics)
      : GpuError(message), diagnostics_(std::move(diagnostics)) {}
  const std::string& diagnostics() const { return diagnostics_; }

 private:
  std::string diagnostics_;
};

struct Size3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t(x) * y * z; }
};

// Memory shared by host and GPU (Metal: MTLStorageModeShared).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* contents() = 0;
  virtual size_t size() const = 0;
};

// A compute pipeline for one kernel function.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const std::string& name() const = 0;
  virtual uint32_t max_threads_per_threadgroup() const = 0;
  virtual uint32_t thread_execution_width() const = 0;
};

// Compiled MSL source.
class Library {
 public:
  virtual ~Library() = default;
  // Throws GpuError naming the function when the library has no such kernel.
  virtual std::shared_ptr<Kernel> kernel(const std::string& name) = 0;
  // The pipelines of `names`, in order (Metal builds them concurrently); `built(done)` is
  // called on the calling thread as they complete. Throws as kernel() does.
  virtual std::vector<std::shared_ptr<Kernel>> kernels(const std::vector<std::string>& names,
                                                       const std::function<void(size_t done)>& built = {});
  // The host names of every kernel function in the library.
  virtual std::vector<std::string> kernel_names() const = 0;
};

// Dispatches recorded in order and run after commit(). Encoding is stateful like
// a Metal compute encoder: bindings and the kernel persist until changed.
// Dispatches between two barrier() calls may run in any order or concurrently.
// Buffers committed on one device run in commit order; when one fails, the ones queued
// behind it fail too (Metal ignores them; the CPU runtime's injected faults do the same).
class CommandBuffer {
 public:
  virtual ~CommandBuffer() = default;
  // Names the buffer (and its encoder) in GPU error messages and Metal's tools; before commit().
  virtual void set_label(const std::string& label) = 0;
  virtual void set_kernel(const std::shared_ptr<Kernel>& kernel) = 0;
  virtual void set_buffer(uint32_t index, const std::shared_ptr<Buffer>& buffer, size_t offset) = 0;
  // Copies up to 4 KiB of argument bytes (Metal's setBytes limit).
  virtual void set_bytes(uint32_t index, const void* data, size_t size) = 0;
  // Threadgroup memory for a [[threadgroup(index)]] kernel argument.
  virtual void set_threadgroup_memory(uint32_t index, size_t size) = 0;
  virtual void dispatch_threadgroups(Size3 threadgroups, Size3 threads_per_threadgroup) = 0;
  // Grid of threads; edge threadgroups may be partial.
  virtual void dispatch_threads(Size3 threads, Size3 threads_per_threadgroup) = 0;
  // Later dispatches see every write of earlier ones.
  virtual void barrier() = 0;
  virtual void commit() = 0;
  // Blocks until the work is done; throws GpuError if it failed, naming the buffer's label
  // (Metal: and each encoder's execution status).
  virtual void wait() = 0;
  // After wait(): seconds the device spent running this command buffer (Metal: GPUEndTime -
  // GPUStartTime; the CPU runtime: the wall time of its execution).
  virtual double gpu_seconds() const = 0;
};

// How the GPU uses a buffer. Read-only buffers (the weights) are written by the host before any
// command buffer uses them and never by the GPU, so Metal need not track hazards on them
// (MTLResourceHazardTrackingModeUntracked): the engine orders every dependent dispatch itself.
enum class Access { read_write, read_only };

// The buffers a device was asked to keep resident (make_resident) that are still alive.
struct Residency {
  uint64_t buffers = 0, bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string kind() const = 0;  // "metal" | "cpu"
  virtual std::string name() const = 0;
  // Largest single buffer (Metal: maxBufferLength, about half of RAM); new_buffer and
  // wrap_host_memory throw GpuError beyond it.
  virtual size_t max_buffer_length() const = 0;
  // Bytes the GPU may use without slowing down (Metal: recommendedMaxWorkingSetSize).
  virtual uint64_t recommended_working_set() const = 0;
  // GPU cores, for work split across them (Metal has no API for it: a table of Apple chips
  // by name, else the class of MTLDevice.architecture, apple_chips.h; the CPU runtime reports
  // a fixed count so its dispatches match no host).
  virtual uint32_t gpu_cores() const = 0;
  // Contents uninitialised.
  virtual std::shared_ptr<Buffer> new_buffer(size_t size, Access access = Access::read_write) = 0;
  // Wraps host memory without copying when the platform allows it for this
  // pointer and size (Metal: page-aligned), else copies. `keep_alive` is released
  // when the buffer no longer needs the memory.
  virtual std::shared_ptr<Buffer> wrap_host_memory(void* data, size_t size, std::shared_ptr<void> keep_alive,
                                                   Access access = Access::read_write) = 0;
  // Keeps long-lived buffers (weights, caches, workspace) resident on the GPU while they live, so
  // an idle pause between requests does not cost the next step a re-wiring of its memory. Metal
  // on macOS 15+: the device's MTLResidencySet, attached to its queue (a buffer leaves it when
  // freed); macOS 14 has no residency API. Both devices count what was declared (resident()).
  virtual void make_resident(const std::vector<std::shared_ptr<Buffer>>& buffers) = 0;
  virtual Residency resident() const = 0;
  // Throws CompileError with the compiler's diagnostics; `name` labels the
  // source in them (a #line inside the source takes over from there).
  virtual std::shared_ptr<Library> compile(const std::string& source, const std::string& name) = 0;
  // The whole shader library compiled when the package was built (Metal: metalqwen.metallib
  // beside the module, built where Xcode was installed), or nullptr when there is none or it was
  // not built from the shader files whose key (EmbeddedFiles::key) is `key`.
  virtual std::shared_ptr<Library> prebuilt_library(const std::string& key) {
    (void)key;
    return nullptr;
  }
  // What compile(source, name) and making its pipelines will spend time on, for a
  // progress line; "" when that is quick (a build the CPU runtime has cached).
  virtual std::string compile_notice(const std::string& source, const std::string& name) const = 0;
  virtual std::unique_ptr<CommandBuffer> new_command_buffer() = 0;
};

// Throws GpuError "[<component>] a <size>-byte buffer exceeds <device>'s limit of <limit> bytes".
void check_buffer_length(const char* component, const std::string& device, size_t size, size_t limit);

// "metal", "cpu", or "" for the best available: Metal, else the CPU runtime, except on
// Apple silicon where a Metal failure throws GpuError saying why (no silent fallback).
std::shared_ptr<Device> open_device(const std::string& kind);
std::vector<std::string> available_device_kinds();
// Why Metal cannot be used here ("" when it can), e.g. for `metalqwen devices`.
std::string metal_unavailable_reason();

}  // namespace mq::gpu
