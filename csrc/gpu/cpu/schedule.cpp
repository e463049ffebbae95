#include "schedule.h"

#include <cstdlib>

#include "../device.h"

namespace mq::cpu {
namespace {

// SplitMix64 finaliser: a well-mixed 64-bit hash, enough to decorrelate nearby streams.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Schedule Schedule::parse(const std::string& text) {
  if (text == "forward") return {Kind::forward, 0};
  if (text == "reverse") return {Kind::reverse, 0};
  const std::string prefix = "random:";
  if (text.compare(0, prefix.size(), prefix) == 0 && text.size() > prefix.size() && text.size() <= prefix.size() + 19 &&
      text.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
    return {Kind::random, std::strtoull(text.c_str() + prefix.size(), nullptr, 10)};
  throw gpu::GpuError("[cpu] unknown schedule '" + text +
                      "' (expected \"forward\", \"reverse\" or \"random:SEED\" with a decimal SEED)");
}

Schedule Schedule::from_environment() {
  const char* env = std::getenv("METALQWEN_CPU_SCHEDULE");
  if (!env || !*env) return {};
  try {
    return parse(env);
  } catch (const gpu::GpuError& e) {
    throw gpu::GpuError(std::string(e.what()) + " in METALQWEN_CPU_SCHEDULE");
  }
}

uint64_t schedule_substream(uint64_t stream, uint64_t index) { return mix(stream ^ mix(index + 1)); }

ScheduleOrder::ScheduleOrder(const Schedule& schedule, uint64_t stream)
    : kind_(schedule.kind), state_(mix(schedule.seed) ^ stream) {}

uint64_t ScheduleOrder::next_random() {
  state_ += 0x9E3779B97F4A7C15ull;
  return mix(state_);
}

void ScheduleOrder::permute(uint32_t first, uint32_t count, uint32_t* order) {
  for (uint32_t i = 0; i < count; ++i) order[i] = kind_ == Schedule::Kind::reverse ? first + count - 1 - i : first + i;
  if (kind_ != Schedule::Kind::random) return;
  for (uint32_t i = count; i > 1; --i) {  // Fisher-Yates
    const uint32_t j = uint32_t(next_random() % i);
    const uint32_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
}

uint32_t ScheduleOrder::pick(uint32_t count) {
  return kind_ == Schedule::Kind::random && count > 1 ? uint32_t(next_random() % count) : 0;
}

}  // namespace mq::cpu
