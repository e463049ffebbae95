// Fibers: one per emulated GPU thread. A fiber runs until it reaches a
// synchronisation point and then switches back to its scheduler.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

// The assembly switch (fiber_switch.h) where we have one, else ucontext.
#if !defined(MQ_FIBER_UCONTEXT) && !(defined(__x86_64__) || defined(__aarch64__))
#define MQ_FIBER_UCONTEXT 1
#endif

#if !MQ_FIBER_UCONTEXT
// Defined in fiber_switch.h: saves the callee-saved registers on the running stack, stores
// its pointer at `save_sp`, and resumes the stack at `load_sp`.
extern "C" __attribute__((visibility("hidden"))) void mq_fiber_switch_asm(void** save_sp, void* load_sp);
#endif

namespace mq::cpu {

// A stack for fibers, with an inaccessible guard page below it.
class FiberStack {
 public:
  explicit FiberStack(size_t size);
  ~FiberStack();
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  char* base() const { return base_; }
  size_t size() const { return size_; }
  char* top() const { return base_ + size_; }

 private:
  char* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  char* base_ = nullptr;
  size_t size_ = 0;
};

// A saved ucontext (the fallback switch).
struct FiberContext;

// Runs `entry(arg)` on `stack` the first time it is switched to. `entry` must
// never return: it ends by switching back to its scheduler.
class Fiber {
 public:
  using Entry = void (*)(void* arg);
  Fiber();
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  void prepare(FiberStack& stack, Entry entry, void* arg);
  // Saves the running context into `from` and resumes `to`. Only the registers a call
  // preserves are switched: the floating-point control state is the OS thread's, which
  // DefaultFloatingPoint sets for every fiber.
  static void switch_to(Fiber& from, Fiber& to);

 private:
#if MQ_FIBER_UCONTEXT
  std::unique_ptr<FiberContext> context_;
#else
  void* sp_ = nullptr;  // the saved stack pointer, held inline: a switch reads it at once
#endif
};

#if !MQ_FIBER_UCONTEXT
inline void Fiber::switch_to(Fiber& from, Fiber& to) { mq_fiber_switch_asm(&from.sp_, to.sp_); }
#endif

// While alive, the calling OS thread computes under IEEE defaults (round to nearest, no
// flush to zero, exceptions masked), as every fiber it runs must; the caller's control state
// comes back at the end. Set once per threadgroup, not at each switch: reloading the x86
// control words at every switch cost about 7 % of the runtime's time.
class DefaultFloatingPoint {
 public:
  DefaultFloatingPoint();
  ~DefaultFloatingPoint();
  DefaultFloatingPoint(const DefaultFloatingPoint&) = delete;
  DefaultFloatingPoint& operator=(const DefaultFloatingPoint&) = delete;

 private:
  uint32_t saved_[2] = {};  // x86_64: MXCSR and the x87 control word; aarch64: FPCR
};

}  // namespace mq::cpu
