#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#if !defined(MQ_FIBER_UCONTEXT) && !(defined(__x86_64__) || defined(__aarch64__))
#define MQ_FIBER_UCONTEXT 1
#endif

#if MQ_FIBER_UCONTEXT
#define _XOPEN_SOURCE 700
#include <ucontext.h>
#else
#include "fiber_switch.h"
#endif

namespace mq::cpu {

FiberStack::FiberStack(size_t size) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_ = (size + page - 1) / page * page;
  mapping_size_ = size_ + page;
  // Page-aligned tops would put every fiber's hot frames in the same L1 sets, which a switch
  // between 32 lanes then thrashes: each new stack ends 9 cache lines further into its page.
  static std::atomic<uint32_t> stacks_made{0};
  size_ -= (stacks_made++ * 9 * 64) % page;
  void* p = mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  mapping_ = static_cast<char*>(p);
  // The lowest page stays inaccessible so a stack overflow faults at once.
  mprotect(mapping_, page, PROT_NONE);
  base_ = mapping_ + page;
}

FiberStack::~FiberStack() { munmap(mapping_, mapping_size_); }

#if MQ_FIBER_UCONTEXT

struct FiberContext {
  ucontext_t uc;
};

Fiber::Fiber() : context_(new FiberContext{}) {}
Fiber::~Fiber() = default;

void Fiber::prepare(FiberStack& stack, Entry entry, void* arg) {
  getcontext(&context_->uc);
  context_->uc.uc_stack.ss_sp = stack.base();
  context_->uc.uc_stack.ss_size = stack.size();
  context_->uc.uc_link = nullptr;
  // makecontext passes int arguments only: split the pointers into halves.
  auto p = reinterpret_cast<uintptr_t>(arg);
  auto e = reinterpret_cast<uintptr_t>(entry);
  makecontext(&context_->uc, reinterpret_cast<void (*)()>(+[](unsigned a0, unsigned a1, unsigned e0, unsigned e1) {
    reinterpret_cast<Entry>((uintptr_t(e1) << 32) | e0)(reinterpret_cast<void*>((uintptr_t(a1) << 32) | a0));
  }),
              4, unsigned(p), unsigned(uint64_t(p) >> 32), unsigned(e), unsigned(uint64_t(e) >> 32));
}

void Fiber::switch_to(Fiber& from, Fiber& to) { swapcontext(&from.context_->uc, &to.context_->uc); }

#else

struct FiberContext {
  void* sp = nullptr;
};

Fiber::Fiber() : context_(new FiberContext{}) {}
Fiber::~Fiber() = default;

void Fiber::prepare(FiberStack& stack, Entry entry, void* arg) {
  context_->sp = initial_stack(stack.top(), entry, arg);
}

void Fiber::switch_to(Fiber& from, Fiber& to) { mq_fiber_switch_asm(&from.context_->sp, to.context_->sp); }

#endif

}  // namespace mq::cpu
