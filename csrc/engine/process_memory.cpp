#include "process_memory.h"

#include <unistd.h>

#include <cstdio>

#if defined(__APPLE__)
#include <mach/mach.h>
#endif

namespace mq::engine {

uint64_t resident_set_bytes() {
#if defined(__APPLE__)
  mach_task_basic_info_data_t info;
  mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
  if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, reinterpret_cast<task_info_t>(&info), &count) != KERN_SUCCESS)
    return 0;
  return uint64_t(info.resident_size);
#else
  // statm: total program size, then resident pages.
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const bool read = std::fscanf(statm, "%llu %llu", &size, &resident) == 2;
  std::fclose(statm);
  return read ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
#endif
}

}  // namespace mq::engine
