// The Metal implementation of device.h (csrc/gpu/metal/metal_device.mm).
// Plain C++: no Objective-C type may appear here. Built only when MQ_HAVE_METAL.
#pragma once
#include <memory>

#include "gpu/device.h"

namespace mq::gpu {

// True when the system has a Metal device (MTLCreateSystemDefaultDevice).
bool metal_available();

// The system default Metal device; throws GpuError "[metal] no Metal device".
std::shared_ptr<Device> open_metal_device();

}  // namespace mq::gpu
