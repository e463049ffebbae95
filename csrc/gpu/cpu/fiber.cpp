#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

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

Fiber::Fiber() = default;
Fiber::~Fiber() = default;

void Fiber::prepare(FiberStack& stack, Entry entry, void* arg) { sp_ = initial_stack(stack.top(), entry, arg); }

#endif

#if defined(__x86_64__)
// MXCSR: all exceptions masked, round to nearest, no FTZ/DAZ; the x87 word: all masked,
// double-extended precision, round to nearest. The MXCSR's low 6 bits are sticky flags.
constexpr uint32_t kDefaultMxcsr = 0x1F80, kMxcsrControl = 0xFFC0, kDefaultX87 = 0x037F;

DefaultFloatingPoint::DefaultFloatingPoint() {
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0" : "=m"(saved_[0]));
  asm volatile("fnstcw %0" : "=m"(x87));
  saved_[1] = x87;
  if ((saved_[0] & kMxcsrControl) != kDefaultMxcsr) {
    const uint32_t mxcsr = kDefaultMxcsr;
    asm volatile("ldmxcsr %0" ::"m"(mxcsr));
  }
  if (x87 != kDefaultX87) {
    const uint16_t word = kDefaultX87;
    asm volatile("fldcw %0" ::"m"(word));
  }
}

DefaultFloatingPoint::~DefaultFloatingPoint() {
  uint32_t mxcsr = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  if ((mxcsr & kMxcsrControl) != (saved_[0] & kMxcsrControl)) {
    mxcsr = (mxcsr & ~kMxcsrControl) | (saved_[0] & kMxcsrControl);  // keep the flags raised since
    asm volatile("ldmxcsr %0" ::"m"(mxcsr));
  }
  if (saved_[1] != kDefaultX87) {
    const uint16_t word = uint16_t(saved_[1]);
    asm volatile("fldcw %0" ::"m"(word));
  }
}

#elif defined(__aarch64__)
// FPCR 0: round to nearest, no flush to zero, default-NaN off, traps disabled.
DefaultFloatingPoint::DefaultFloatingPoint() {
  uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  saved_[0] = uint32_t(fpcr);
  if (fpcr != 0) asm volatile("msr fpcr, %0" ::"r"(uint64_t(0)));
}

DefaultFloatingPoint::~DefaultFloatingPoint() {
  if (saved_[0] != 0) asm volatile("msr fpcr, %0" ::"r"(uint64_t(saved_[0])));
}

#else
DefaultFloatingPoint::DefaultFloatingPoint() = default;
DefaultFloatingPoint::~DefaultFloatingPoint() = default;
#endif

}  // namespace mq::cpu
