// Runs on Linux: the checks the Metal backend makes before calling Metal
// (csrc/gpu/metal/metal_rules.h).
#include "gpu/metal/metal_rules.h"
#include "gpu/apple_chips.h"

#include <cstdio>
#include <functional>
#include <string>

using mq::gpu::GpuError;
using mq::gpu::Size3;
using mq::gpu::metal::EncoderRules;

namespace {

int passed = 0, failed = 0;

void expect(bool ok, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED: %s\n", what);
  }
}

// Expects a GpuError whose message starts with `prefix` and contains every fragment.
void expect_error(const std::function<void()>& body, std::initializer_list<const char*> fragments, const char* what,
                  const char* prefix = "[metal] ") {
  try {
    body();
  } catch (const GpuError& e) {
    const std::string message = e.what();
    bool ok = message.rfind(prefix, 0) == 0;
    for (const char* f : fragments) ok = ok && message.find(f) != std::string::npos;
    if (!ok) std::printf("  message was: %s\n", message.c_str());
    expect(ok, what);
    return;
  }
  expect(false, what);
}

}  // namespace

int main() {
  using mq::gpu::metal::host_memory_wrappable;
  const size_t page = 16384;  // Apple-silicon page size
  alignas(16384) static char pages[3 * 16384];
  expect(host_memory_wrappable(pages, 2 * page, page), "whole pages wrap");
  expect(!host_memory_wrappable(pages + 64, 2 * page, page), "unaligned pointer copies");
  expect(!host_memory_wrappable(pages, 2 * page - 1, page), "partial last page copies");
  expect(!host_memory_wrappable(pages, 0, page), "empty copies");
  expect(!host_memory_wrappable(nullptr, page, page), "null copies");

  using mq::gpu::metal::line_directive;
  expect(line_directive("shaders/norm.metal") == "#line 1 \"shaders/norm.metal\"\n", "line directive");
  expect(line_directive("a\"b\\c\nd") == "#line 1 \"a\\\"b\\\\cd\"\n", "line directive escapes");

  using mq::gpu::metal::describe_failed_buffer;
  expect(describe_failed_buffer("decode step", "Caused GPU Timeout Error", {}) ==
             "[metal] command buffer 'decode step' failed: Caused GPU Timeout Error",
         "failed buffer without encoder status");
  expect(describe_failed_buffer("prefill chunk (layers 0-7)", "Ignored",
                                {{"prefill chunk (layers 0-7)", 4}, {"x", 2}, {"y", 9}}) ==
             "[metal] command buffer 'prefill chunk (layers 0-7)' failed: Ignored; encoders: "
             "'prefill chunk (layers 0-7)' faulted, 'x' affected, 'y' state 9",
         "failed buffer names each encoder's state");

  EncoderRules rules(32768);
  expect_error([&] { rules.check_dispatch("dispatch_threads", {64, 1, 1}, {32, 1, 1}); },
               {"dispatch_threads", "no kernel set"}, "dispatch without kernel");
  rules.set_kernel("rms_norm_f32", 1024);
  rules.check_dispatch("dispatch_threads", {64, 1, 1}, {32, 1, 1});
  expect_error([&] { rules.check_dispatch("dispatch_threads", {0, 1, 1}, {32, 1, 1}); }, {"empty dispatch"},
               "empty grid");
  expect_error([&] { rules.check_dispatch("dispatch_threadgroups", {1, 1, 1}, {64, 32, 1}); },
               {"2048", "1024", "'rms_norm_f32'"}, "too many threads per group");
  expect_error([&] { rules.check_dispatch("dispatch_threadgroups", {1, 1, 1}, {0, 1, 1}); }, {"empty dispatch"},
               "zero threads per group");
  expect_error([&] { rules.check_index("set_buffer", 31); }, {"index 31", "'rms_norm_f32'"}, "index 31");
  rules.check_index("set_buffer", 30);
  expect_error([&] { rules.check_buffer(0, 256, 256); }, {"offset 256"}, "offset at end");
  rules.check_buffer(0, 0, 0);
  rules.check_buffer(0, 255, 256);
  expect_error([&] { rules.check_bytes(0, pages, 4097); }, {"4097"}, "set_bytes > 4 KiB");
  expect_error([&] { rules.check_bytes(0, nullptr, 4); }, {"no bytes"}, "set_bytes null");
  rules.check_bytes(0, pages, 4096);
  rules.check_threadgroup_memory(0, 32768);
  expect_error([&] { rules.check_threadgroup_memory(0, 100); }, {"multiple of 16"}, "tg not 16-aligned");
  expect_error([&] { rules.check_threadgroup_memory(0, 32784); }, {"32768"}, "tg over limit");

  rules.mark_committed();
  expect(rules.committed(), "committed");
  expect_error([&] { rules.check_dispatch("dispatch_threads", {64, 1, 1}, {32, 1, 1}); }, {"already committed"},
               "dispatch after commit");
  expect_error([&] { rules.check_bytes(0, pages, 4); }, {"already committed"}, "set_bytes after commit");
  expect_error([&] { rules.set_kernel("x", 1); }, {"already committed"}, "set_kernel after commit");
  expect_error([&] { rules.mark_committed(); }, {"commit", "already committed"}, "commit twice");

  // Device(): Metal when it opened; the CPU runtime off Apple silicon; never silently on it.
  using mq::gpu::metal::default_device_kind;
  expect(default_device_kind(true, "") == "metal", "Apple silicon with Metal opens Metal");
  expect(default_device_kind(false, "") == "metal", "Intel Mac with a usable Metal GPU opens Metal");
  expect(default_device_kind(false, "[gpu] this build has no Metal backend") == "cpu", "Linux falls back to cpu");
  const std::string no_device =
      "[metal] no Metal device: MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none";
  expect_error([&] { default_device_kind(true, no_device); }, {"Apple-silicon", "no Metal device", "Device(\"cpu\")"},
               "Apple silicon never falls back silently", "[gpu] ");

  // What open_metal_device requires, each refusal a sentence naming what is missing.
  using namespace mq::gpu::metal;
  check_macos_version(true);
  expect_error([&] { check_macos_version(false); }, {"macOS 14", "bfloat", "3.1"}, "macOS 13 refused");
  check_gpu_family("Apple M1", true);
  expect_error([&] { check_gpu_family("AMD Radeon Pro 5500M", false); },
               {"family Apple7 (M1/A14) or newer; this is AMD Radeon Pro 5500M"}, "non-Apple7 GPU refused");
  check_simd_width("Apple M1", 32);
  expect_error([&] { check_simd_width("Intel UHD Graphics 630", 16); },
               {"32-wide", "Intel UHD Graphics 630", "16 wide"}, "SIMD width 16 refused");
  expect_error([&] { check_simd_width("AMD Radeon Pro 5500M", 64); }, {"64 wide"}, "SIMD width 64 refused");
  expect(std::string(kProbeKernelSource).find(std::string("kernel void ") + kProbeKernelName) != std::string::npos,
         "the probe source defines the probe kernel");

  // GPU cores: the table by name (exact for the chips it knows), else the architecture's class.
  using mq::gpu::apple_gpu_cores;
  expect(apple_gpu_cores("Apple M4 Max", "applegpu_g16c") == 40, "a known chip: the table's count");
  expect(apple_gpu_cores("Apple M9 Max", "applegpu_g21c") == 38, "a new Max: its class's typical count");
  expect(apple_gpu_cores("Apple M9 Pro", "applegpu_g21s") == 18 && apple_gpu_cores("Apple M9", "applegpu_g21g") == 10 &&
             apple_gpu_cores("Apple M9 Ultra", "applegpu_g21d") == 76,
         "each class letter");
  expect(apple_gpu_cores("Apple M9", "") == 10 && apple_gpu_cores("Apple M9", "gfx1100") == 10,
         "no architecture, or not an Apple one: a base chip's 10");

  std::printf("metal_rules_test: %d checks passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
