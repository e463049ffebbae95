// Standalone check of the fiber context switch (csrc/gpu/cpu/fiber.cpp): four
// fibers interleave with a scheduler; integer and floating-point state must
// survive every switch, and fibers compute under DefaultFloatingPoint's rounding whatever
// the OS thread's was. Built natively and, under qemu, for aarch64 (Apple silicon's ABI).
#include <cfenv>
#include <cstdio>

#include "fiber.h"

using mq::cpu::Fiber;
using mq::cpu::FiberStack;

namespace {

constexpr int kFibers = 4, kRounds = 3;
Fiber scheduler;
int totals[kFibers];
volatile float third = 1.0f;  // volatile: computed at run time, under the mode in force
bool rounded_to_nearest[kFibers];

struct Task {
  int id;
  Fiber* self;
};

void body(void* arg) {
  auto* task = static_cast<Task*>(arg);
  rounded_to_nearest[task->id] = third / 3.0f == 0x1.555556p-2f;  // upward would give the same; downward not
  for (int round = 0; round < kRounds; ++round) {
    double value = task->id * 1.5 + round;  // lives in callee-saved FP registers across the switch
    Fiber::switch_to(*task->self, scheduler);
    totals[task->id] += int(value * 2);
  }
  totals[task->id] += 1000;
  Fiber::switch_to(*task->self, scheduler);
}

}  // namespace

int main() {
  FiberStack stacks[kFibers] = {FiberStack(1 << 16), FiberStack(1 << 16), FiberStack(1 << 16), FiberStack(1 << 16)};
  Fiber fibers[kFibers];
  Task tasks[kFibers];
  for (int i = 0; i < kFibers; ++i) {
    tasks[i] = {i, &fibers[i]};
    fibers[i].prepare(stacks[i], body, &tasks[i]);
  }
  volatile double kept = 3.25;
  std::fesetround(FE_DOWNWARD);
  {
    const mq::cpu::DefaultFloatingPoint ieee;
    for (int round = 0; round <= kRounds; ++round)
      for (int i = 0; i < kFibers; ++i) Fiber::switch_to(scheduler, fibers[i]);
  }
  int failures = kept != 3.25;
  if (std::fegetround() != FE_DOWNWARD || third / 3.0f == 0x1.555556p-2f) {
    std::printf("the thread's rounding mode was not restored\n");
    ++failures;
  }
  std::fesetround(FE_TONEAREST);
  for (int i = 0; i < kFibers; ++i)
    if (!rounded_to_nearest[i]) {
      std::printf("fiber %d did not round to nearest\n", i);
      ++failures;
    }
  for (int i = 0; i < kFibers; ++i) {
    int want = 1000;
    for (int round = 0; round < kRounds; ++round) want += int((i * 1.5 + round) * 2);
    if (totals[i] != want) {
      std::printf("fiber %d: total %d, want %d\n", i, totals[i], want);
      ++failures;
    }
  }
  std::printf("fiber_test: %s\n", failures ? "FAILED" : "ok");
  return failures != 0;
}
