// Peak memory bandwidth of Apple silicon, by the name Metal gives the GPU (MTLDevice.name).
#pragma once
#include <string>

namespace mq::bench {

struct ChipBandwidth {
  std::string chip;    // e.g. "M4 Max"; empty when the name is not an Apple chip of the table
  double gb_s = 0;     // peak GB/s (10^9 bytes); 0 when unknown
  std::string note;    // e.g. that a binned variant has less
};

// "Apple M4 Max" -> {"M4 Max", 546, ...}; anything else (the CPU runtime, a new chip) -> {}.
ChipBandwidth chip_bandwidth(const std::string& device_name);

}  // namespace mq::bench
