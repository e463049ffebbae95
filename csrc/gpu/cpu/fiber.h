// Fibers: one per emulated GPU thread. A fiber runs until it reaches a
// synchronisation point and then switches back to its scheduler.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

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

// A saved execution context: the stack pointer (assembly switch) or a ucontext.
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
  // Saves the running context into `from` and resumes `to`.
  static void switch_to(Fiber& from, Fiber& to);

 private:
  std::unique_ptr<FiberContext> context_;
};

}  // namespace mq::cpu
