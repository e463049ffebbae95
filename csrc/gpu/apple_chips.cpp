#include "apple_chips.h"

#include <map>

namespace mq::gpu {

// GPU cores: Apple's specifications of each chip's full configuration.
// Apple's published unified-memory bandwidth per chip (newsroom announcements and the
// Mac technical specifications pages: M1 family Nov 2020 - Mar 2022, M2 family Jun 2022 -
// Jun 2023, M3 family Oct 2023 - Mar 2025, M4 family May - Oct 2024, M5 Oct 2025); M1's
// 68.25 GB/s is its LPDDR4X-4266 128-bit interface (Apple gave no figure). Where a chip comes
// in two bins with different bandwidth, the table holds the full chip's: the note says so.
AppleChip apple_chip(const std::string& device_name) {
  static const std::map<std::string, AppleChip> kChips = {
      {"M1", {"M1", 8, 68.25, ""}},
      {"M1 Pro", {"M1 Pro", 16, 200, ""}},
      {"M1 Max", {"M1 Max", 32, 400, ""}},
      {"M1 Ultra", {"M1 Ultra", 64, 800, ""}},
      {"M2", {"M2", 10, 100, ""}},
      {"M2 Pro", {"M2 Pro", 19, 200, ""}},
      {"M2 Max", {"M2 Max", 38, 400, ""}},
      {"M2 Ultra", {"M2 Ultra", 76, 800, ""}},
      {"M3", {"M3", 10, 100, ""}},
      {"M3 Pro", {"M3 Pro", 18, 150, ""}},
      {"M3 Max", {"M3 Max", 40, 400, "the 30-core-GPU M3 Max has 300 GB/s (pass --peak-gbs 300)"}},
      {"M3 Ultra", {"M3 Ultra", 80, 819, ""}},
      {"M4", {"M4", 10, 120, ""}},
      {"M4 Pro", {"M4 Pro", 20, 273, ""}},
      {"M4 Max", {"M4 Max", 40, 546, "the 32-core-GPU M4 Max has 410 GB/s (pass --peak-gbs 410)"}},
      {"M5", {"M5", 10, 153, ""}},
  };
  const std::string prefix = "Apple ";
  if (device_name.rfind(prefix, 0) != 0) return {};
  auto it = kChips.find(device_name.substr(prefix.size()));
  return it == kChips.end() ? AppleChip{} : it->second;
}

uint32_t apple_gpu_cores(const std::string& device_name, const std::string& architecture) {
  if (const uint32_t known = apple_chip(device_name).gpu_cores) return known;
  const std::string prefix = "applegpu_";
  if (architecture.rfind(prefix, 0) == 0 && architecture.size() > prefix.size()) {
    switch (architecture.back()) {  // typical counts of each class over M1..M4
      case 'p': return 5;
      case 'g': return 10;
      case 's': return 18;
      case 'c': return 38;
      case 'd': return 76;
    }
  }
  return 10;
}

}  // namespace mq::gpu
