// Standalone check of the fiber context switch (csrc/gpu/cpu/fiber.cpp): four
// fibers interleave with a scheduler; integer and floating-point state must
// survive every switch. Built natively and, under qemu, for aarch64 (Apple silicon's ABI).
#include <cstdio>

#include "fiber.h"

using mq::cpu::Fiber;
using mq::cpu::FiberStack;

namespace {

constexpr int kFibers = 4, kRounds = 3;
Fiber scheduler;
int totals[kFibers];

struct Task {
  int id;
  Fiber* self;
};

void body(void* arg) {
  auto* task = static_cast<Task*>(arg);
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
  for (int round = 0; round <= kRounds; ++round)
    for (int i = 0; i < kFibers; ++i) Fiber::switch_to(scheduler, fibers[i]);
  int failures = kept != 3.25;
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
