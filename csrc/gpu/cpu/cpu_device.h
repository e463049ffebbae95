// The CPU runtime's Device (see DESIGN.md section 3).
#pragma once
#include <memory>

#include "../device.h"

namespace mq::gpu {
std::shared_ptr<Device> open_cpu_device();
}
