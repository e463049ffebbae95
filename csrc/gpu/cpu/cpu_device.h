// The CPU runtime's Device (see docs/cpu-runtime.md).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../device.h"

namespace mq::gpu {
// `schedule`: "forward", "reverse" or "random:SEED" (see schedule.h); empty means
// METALQWEN_CPU_SCHEDULE, else forward. `checks`: "races", "bounds" (the checking mode,
// cpu/access_checker.h); none means METALQWEN_CPU_CHECKS.
std::shared_ptr<Device> open_cpu_device(const std::string& schedule = "", const std::vector<std::string>& checks = {});
}  // namespace mq::gpu
