// The process's memory as the OS counts it, for the load's statistics.
#pragma once
#include <cstdint>

namespace mq::engine {

// Bytes of the process resident in RAM now (Linux: /proc/self/statm; macOS: the task's
// resident_size); 0 where neither is available.
uint64_t resident_set_bytes();

}  // namespace mq::engine
