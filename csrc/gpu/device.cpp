#include "device.h"

#include "cpu/cpu_device.h"
#if MQ_HAVE_METAL
#include "metal/metal_device.h"
#endif

namespace mq::gpu {

std::vector<std::string> available_device_kinds() {
  std::vector<std::string> kinds;
#if MQ_HAVE_METAL
  if (metal_available()) kinds.push_back("metal");
#endif
  kinds.push_back("cpu");
  return kinds;
}

std::shared_ptr<Device> open_device(const std::string& kind, const std::vector<std::string>& checks) {
  const std::string chosen = kind.empty() ? available_device_kinds().front() : kind;
  if (chosen == "cpu") return open_cpu_device(checks);
  if (!checks.empty()) throw GpuError("[gpu] checks= is a CPU-runtime feature; open Device(\"cpu\", checks=...)");
#if MQ_HAVE_METAL
  if (chosen == "metal") return open_metal_device();
#endif
  if (chosen == "metal") throw GpuError("[gpu] no Metal device: this build or machine has only the CPU runtime");
  throw GpuError("[gpu] unknown device kind '" + chosen + "' (expected \"metal\" or \"cpu\")");
}

}  // namespace mq::gpu
