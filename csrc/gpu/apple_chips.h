// Apple silicon GPUs by the name Metal gives them (MTLDevice.name): what the public API does
// not report (core count, peak memory bandwidth). The engine sizes work by cores; bench/
// compares measured bandwidth with the peak.
#pragma once
#include <cstdint>
#include <string>

namespace mq::gpu {

struct AppleChip {
  std::string chip;        // e.g. "M4 Max"; empty when the name is not an Apple chip of the table
  uint32_t gpu_cores = 0;  // the full chip's (binned parts have a few fewer); 0 when unknown
  double gb_s = 0;         // peak GB/s (10^9 bytes); 0 when unknown
  std::string note;        // e.g. that a binned variant has less bandwidth
};

// "Apple M4 Max" -> {"M4 Max", 40, 546, ...}; anything else (the CPU runtime, a new chip) -> {}.
AppleChip apple_chip(const std::string& device_name);

// GPU cores to size work by: the table's for a chip it knows by name, else from Metal's
// architecture name (MTLDevice.architecture.name, e.g. "applegpu_g15s"), whose last letter is
// the chip's class (MLX reads it so): g base, s Pro, c Max, d Ultra (p phone); else 10. The
// architecture names no core count, so a new chip gets a typical count of its class.
uint32_t apple_gpu_cores(const std::string& device_name, const std::string& architecture);

}  // namespace mq::gpu
