#include "device.h"

#include "cpu/cpu_device.h"
#include "metal/metal_rules.h"
#if MQ_HAVE_METAL
#include "metal/metal_device.h"
#endif

namespace mq::gpu {
namespace {

// An arm64 macOS build runs only on Apple silicon (an x86_64 build under Rosetta counts as Intel).
#if defined(__APPLE__) && defined(__aarch64__)
constexpr bool kAppleSilicon = true;
#else
constexpr bool kAppleSilicon = false;
#endif

// The Metal device, or nullptr with the reason it did not open in `error`.
std::shared_ptr<Device> try_open_metal(std::string& error) {
#if MQ_HAVE_METAL
  try {
    return open_metal_device();
  } catch (const GpuError& e) {
    error = e.what();
  }
#else
  error = "[gpu] this build has no Metal backend (Metal exists only on macOS)";
#endif
  return nullptr;
}

}  // namespace

std::vector<std::shared_ptr<Kernel>> Library::kernels(const std::vector<std::string>& names,
                                                      const std::function<void(size_t done)>& built) {
  std::vector<std::shared_ptr<Kernel>> result;
  for (const std::string& name : names) {
    result.push_back(kernel(name));
    if (built) built(result.size());
  }
  return result;
}

void check_buffer_length(const char* component, const std::string& device, size_t size, size_t limit) {
  if (size > limit) {
    throw GpuError(std::string("[") + component + "] a " + std::to_string(size) + "-byte buffer exceeds " + device +
                   "'s limit of " + std::to_string(limit) + " bytes");
  }
}

// Opening Metal compiles a probe kernel and creates a queue; the answer cannot change while
// the process runs, so it is found once.
std::string metal_unavailable_reason() {
  static const std::string reason = [] {
    std::string error;
    try_open_metal(error);
    return error;
  }();
  return reason;
}

std::vector<std::string> available_device_kinds() {
  std::vector<std::string> kinds;
  if (metal_unavailable_reason().empty()) kinds.push_back("metal");
  kinds.push_back("cpu");
  return kinds;
}

std::shared_ptr<Device> open_device(const std::string& kind) {
  if (kind == "cpu") return open_cpu_device();
  std::string error;
  std::shared_ptr<Device> metal_device = try_open_metal(error);
  if (kind == "metal") {
    if (!metal_device) throw GpuError(error);
    return metal_device;
  }
  if (!kind.empty()) throw GpuError("[gpu] unknown device kind '" + kind + "' (expected \"metal\" or \"cpu\")");
  return metal::default_device_kind(kAppleSilicon, error) == "metal" ? metal_device : open_cpu_device();
}

}  // namespace mq::gpu
