// The order in which the CPU runtime runs what a GPU runs concurrently: the threadgroups
// of a dispatch, the SIMD-groups of a threadgroup, the lanes of a SIMD-group. `forward`
// is index order; `reverse` and `random:SEED` expose code that silently relies on it.
#pragma once
#include <cstdint>
#include <string>

namespace mq::cpu {

struct Schedule {
  enum class Kind : uint8_t { forward, reverse, random };
  Kind kind = Kind::forward;
  uint64_t seed = 0;

  // "forward", "reverse" or "random:SEED" (SEED a decimal integer); throws GpuError.
  static Schedule parse(const std::string& text);
  // METALQWEN_CPU_SCHEDULE, forward when unset or empty.
  static Schedule from_environment();
};

// A reproducible stream of orders for one scope (a dispatch, or one of its threadgroups):
// the same schedule and stream id always give the same sequence of decisions.
class ScheduleOrder {
 public:
  ScheduleOrder(const Schedule& schedule, uint64_t stream);
  // Writes a permutation of first, first + 1, ..., first + count - 1 into order[0, count).
  void permute(uint32_t first, uint32_t count, uint32_t* order);
  // Which of `count` ready candidates goes next: 0 (the head) unless random.
  uint32_t pick(uint32_t count);

 private:
  uint64_t next_random();
  Schedule::Kind kind_;
  uint64_t state_;
};

// The stream id of a sub-scope (threadgroup `index` of a dispatch, a dispatch of a device).
uint64_t schedule_substream(uint64_t stream, uint64_t index);

}  // namespace mq::cpu
