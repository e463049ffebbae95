// The Metal implementation of device.h (csrc/gpu/metal/metal_device.mm).
// Plain C++: no Objective-C type may appear here. Built only when MQ_HAVE_METAL.
#pragma once
#include <memory>

#include "gpu/device.h"

namespace mq::gpu {

// The system's Metal device, checked against what the shaders need (macOS 14, an Apple7+
// GPU, 32-wide SIMD-groups); throws GpuError saying what is missing.
std::shared_ptr<Device> open_metal_device();

}  // namespace mq::gpu
