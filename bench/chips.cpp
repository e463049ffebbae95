#include "chips.h"

#include <map>

namespace mq::bench {

// Apple's published unified-memory bandwidth per chip (newsroom announcements and the
// Mac technical specifications pages: M1 family Nov 2020 - Mar 2022, M2 family Jun 2022 -
// Jun 2023, M3 family Oct 2023 - Mar 2025, M4 family May - Oct 2024, M5 Oct 2025); M1's
// 68.25 GB/s is its LPDDR4X-4266 128-bit interface (Apple gave no figure). Where a chip comes
// in two bins with different bandwidth, the table holds the full chip's: the note says so.
ChipBandwidth chip_bandwidth(const std::string& device_name) {
  static const std::map<std::string, ChipBandwidth> kChips = {
      {"M1", {"M1", 68.25, ""}},
      {"M1 Pro", {"M1 Pro", 200, ""}},
      {"M1 Max", {"M1 Max", 400, ""}},
      {"M1 Ultra", {"M1 Ultra", 800, ""}},
      {"M2", {"M2", 100, ""}},
      {"M2 Pro", {"M2 Pro", 200, ""}},
      {"M2 Max", {"M2 Max", 400, ""}},
      {"M2 Ultra", {"M2 Ultra", 800, ""}},
      {"M3", {"M3", 100, ""}},
      {"M3 Pro", {"M3 Pro", 150, ""}},
      {"M3 Max", {"M3 Max", 400, "the 30-core-GPU M3 Max has 300 GB/s (pass --peak-gbs 300)"}},
      {"M3 Ultra", {"M3 Ultra", 819, ""}},
      {"M4", {"M4", 120, ""}},
      {"M4 Pro", {"M4 Pro", 273, ""}},
      {"M4 Max", {"M4 Max", 546, "the 32-core-GPU M4 Max has 410 GB/s (pass --peak-gbs 410)"}},
      {"M5", {"M5", 153, ""}},
  };
  const std::string prefix = "Apple ";
  if (device_name.rfind(prefix, 0) != 0) return {};
  auto it = kChips.find(device_name.substr(prefix.size()));
  return it == kChips.end() ? ChipBandwidth{} : it->second;
}

}  // namespace mq::bench
