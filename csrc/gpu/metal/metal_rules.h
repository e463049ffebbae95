// What the Metal backend checks before it calls Metal: the limits Metal would
// otherwise assert on (or crash the process over), kept in plain C++ so they build
// and are tested on Linux (tools/metal_check/metal_rules_test.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/device.h"

namespace mq::gpu::metal {

constexpr uint32_t kArgumentTableSize = 31;      // buffer and threadgroup-memory tables
constexpr size_t kMaxSetBytes = 4096;            // setBytes:length:atIndex: is for up to 4 KiB
constexpr size_t kThreadgroupMemoryAlign = 16;   // setThreadgroupMemoryLength: wants 16 B multiples
constexpr uint32_t kSimdWidth = 32;              // the shaders' SIMD-group reductions assume 32 lanes

// The kind open_device("") opens, given whether this is an Apple-silicon Mac and why Metal
// did not open ("" when it did). Off Apple silicon the CPU runtime is the fallback; on it,
// falling back silently would hide a broken install behind a runtime 100x slower, so the
// reason is thrown instead.
inline std::string default_device_kind(bool apple_silicon, const std::string& metal_error) {
  if (metal_error.empty()) return "metal";
  if (!apple_silicon) return "cpu";
  throw GpuError("[gpu] Metal could not be opened on this Apple-silicon Mac: " + metal_error +
                 "\nDevice() does not fall back to the CPU runtime here; ask for it by name "
                 "(Device(\"cpu\"), --device cpu) to use it anyway");
}

// What open_metal_device requires; each failure is a sentence for the user.
inline void check_macos_version(bool macos_14_or_newer) {
  if (!macos_14_or_newer) {
    throw GpuError(
        "[metal] metalqwen needs macOS 14 or newer: its shaders use bfloat, which needs "
        "Metal Shading Language 3.1; this Mac runs an older macOS");
  }
}

inline void check_gpu_family(const std::string& gpu, bool apple7_or_newer) {
  if (!apple7_or_newer) {
    throw GpuError("[metal] metalqwen needs an Apple GPU of family Apple7 (M1/A14) or newer; this is " + gpu);
  }
}

// `width`: threadExecutionWidth of a pipeline, the SIMD-group width kernels run at.
inline void check_simd_width(const std::string& gpu, uint32_t width) {
  if (width != kSimdWidth) {
    throw GpuError("[metal] metalqwen's kernels need 32-wide SIMD-groups; " + gpu + " runs them " +
                   std::to_string(width) + " wide");
  }
}

// A kernel using what every shader of the engine needs (bfloat, a SIMD-group reduction):
// it must compile, and its pipeline tells the SIMD width.
constexpr const char* kProbeKernelName = "metalqwen_probe";
constexpr const char* kProbeKernelSource = R"(#include <metal_stdlib>
using namespace metal;
kernel void metalqwen_probe(device bfloat* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = bfloat(simd_sum(float(i)));
}
)";

inline uint32_t probe_simd_width(Device& device) {
  return device.compile(kProbeKernelSource, "metalqwen_probe.metal")
      ->kernel(kProbeKernelName)
      ->thread_execution_width();
}

// newBufferWithBytesNoCopy: needs a page-aligned pointer and a length that ends on
// a page boundary; rounding the length up could reach past the caller's mapping,
// so only whole pages are wrapped.
inline bool host_memory_wrappable(const void* data, size_t size, size_t page_size) {
  return data != nullptr && size > 0 && page_size > 0 && reinterpret_cast<uintptr_t>(data) % page_size == 0 &&
         size % page_size == 0;
}

// `#line 1 "name"` + newline: source line 1 is then reported as name:1.
inline std::string line_directive(const std::string& name) {
  std::string quoted;
  for (char c : name) {
    if (c == '"' || c == '\\') quoted += '\\';
    if (c != '\n' && c != '\r') quoted += c;
  }
  return "#line 1 \"" + quoted + "\"\n";
}

// One encoder's entry in a failed command buffer's error (MTLCommandBufferEncoderInfo): its
// label and errorState (MTLCommandEncoderErrorState, 0..4).
struct EncoderStatus {
  std::string label;
  long state = 0;
};

// The message of a failed command buffer: its label, Metal's description and what each of
// its encoders was doing (Metal lists them when the buffer was made with
// MTLCommandBufferErrorOptionEncoderExecutionStatus).
inline std::string describe_failed_buffer(const std::string& label, const std::string& description,
                                          const std::vector<EncoderStatus>& encoders) {
  static const char* const kStates[] = {"unknown", "completed", "affected", "pending", "faulted"};
  std::string text = "[metal] command buffer '" + label + "' failed: " + description;
  for (size_t i = 0; i < encoders.size(); ++i) {
    const long s = encoders[i].state;
    text += (i == 0 ? "; encoders: '" : ", '") + encoders[i].label + "' " +
            (s >= 0 && s <= 4 ? kStates[s] : "state " + std::to_string(s));
  }
  return text;
}

// The state of one command buffer's compute encoder as far as checking goes.
// Every check throws GpuError("[metal] <op>: ...") naming the bound kernel.
class EncoderRules {
 public:
  explicit EncoderRules(size_t max_threadgroup_memory) : max_threadgroup_memory_(max_threadgroup_memory) {}

  void set_kernel(const std::string& name, uint32_t max_threads_per_threadgroup) {
    check_open("set_kernel");
    kernel_ = name;
    max_threads_ = max_threads_per_threadgroup;
  }

  void check_buffer(uint32_t index, size_t offset, size_t buffer_size) const {
    check_index("set_buffer", index);
    if (offset > 0 && offset >= buffer_size) {
      fail("set_buffer", "offset " + std::to_string(offset) + " at index " + std::to_string(index) +
                             " is past the end of a " + std::to_string(buffer_size) + "-byte buffer");
    }
  }

  void check_bytes(uint32_t index, const void* data, size_t size) const {
    check_index("set_bytes", index);
    if (data == nullptr || size == 0) fail("set_bytes", "no bytes given for index " + std::to_string(index));
    if (size > kMaxSetBytes) {
      fail("set_bytes", std::to_string(size) + " bytes at index " + std::to_string(index) +
                            " exceed the 4096-byte limit: use a buffer");
    }
  }

  void check_threadgroup_memory(uint32_t index, size_t size) const {
    check_index("set_threadgroup_memory", index);
    if (size % kThreadgroupMemoryAlign != 0) {
      fail("set_threadgroup_memory",
           std::to_string(size) + " bytes at index " + std::to_string(index) + " are not a multiple of 16");
    }
    if (size > max_threadgroup_memory_) {
      fail("set_threadgroup_memory", std::to_string(size) + " bytes at index " + std::to_string(index) +
                                         " exceed the device's " + std::to_string(max_threadgroup_memory_) +
                                         "-byte threadgroup memory");
    }
  }

  void check_dispatch(const char* op, Size3 grid, Size3 threads_per_threadgroup) const {
    check_open(op);
    if (kernel_.empty()) fail(op, "no kernel set");
    const Size3& t = threads_per_threadgroup;
    if (t.count() == 0 || grid.count() == 0) {
      fail(op, "empty dispatch: grid " + format(grid) + ", threads per threadgroup " + format(t));
    }
    if (t.count() > max_threads_) {
      fail(op, "threads per threadgroup " + format(t) + " = " + std::to_string(t.count()) +
                   " exceed the kernel's limit of " + std::to_string(max_threads_));
    }
  }

  void check_open(const char* op) const {
    if (committed_) fail(op, "command buffer already committed");
  }

  void check_index(const char* op, uint32_t index) const {
    check_open(op);
    if (index >= kArgumentTableSize) {
      fail(op,
           "index " + std::to_string(index) + " is out of range (0.." + std::to_string(kArgumentTableSize - 1) + ")");
    }
  }

  void mark_committed() {
    check_open("commit");
    committed_ = true;
  }
  bool committed() const { return committed_; }

  [[noreturn]] void fail(const char* op, const std::string& what) const {
    const std::string kernel = kernel_.empty() ? "no kernel set" : "kernel '" + kernel_ + "'";
    throw GpuError(std::string("[metal] ") + op + ": " + what + " (" + kernel + ")");
  }

 private:
  static std::string format(Size3 s) {
    return "(" + std::to_string(s.x) + ", " + std::to_string(s.y) + ", " + std::to_string(s.z) + ")";
  }

  size_t max_threadgroup_memory_;
  std::string kernel_;
  uint32_t max_threads_ = 0;
  bool committed_ = false;
};

}  // namespace mq::gpu::metal
