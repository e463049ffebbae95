#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

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
#endif

namespace mq::cpu {

FiberStack::FiberStack(size_t size) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_ = (size + page - 1) / page * page;
  mapping_size_ = size_ + page;
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
                reinterpret_cast<Entry>((uintptr_t(e1) << 32) | e0)(
                    reinterpret_cast<void*>((uintptr_t(a1) << 32) | a0));
              }),
              4, unsigned(p), unsigned(uint64_t(p) >> 32), unsigned(e), unsigned(uint64_t(e) >> 32));
}

void Fiber::switch_to(Fiber& from, Fiber& to) { swapcontext(&from.context_->uc, &to.context_->uc); }

#else

#if defined(__APPLE__)
#define MQ_ASM_SYM(name) "_" #name
#define MQ_ASM_TYPE(name) ""
#else
#define MQ_ASM_SYM(name) #name
#define MQ_ASM_TYPE(name) ".type " #name ",@function\n"
#endif

extern "C" void mq_fiber_switch_asm(void** save_sp, void* load_sp);
extern "C" void mq_fiber_start_asm();

#if defined(__x86_64__)
// Saves the System V callee-saved registers plus the SSE/x87 control words.
asm(".text\n"
    ".globl " MQ_ASM_SYM(mq_fiber_switch_asm) "\n" MQ_ASM_TYPE(mq_fiber_switch_asm)
    MQ_ASM_SYM(mq_fiber_switch_asm) ":\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $16, %rsp\n  stmxcsr 8(%rsp)\n  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  fldcw (%rsp)\n  ldmxcsr 8(%rsp)\n  addq $16, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".globl " MQ_ASM_SYM(mq_fiber_start_asm) "\n" MQ_ASM_TYPE(mq_fiber_start_asm)
    MQ_ASM_SYM(mq_fiber_start_asm) ":\n"
    "  movq %r12, %rdi\n  andq $-16, %rsp\n  callq *%r13\n  ud2\n");

// A fresh stack, lowest address first, as mq_fiber_switch_asm pops it:
// fpcw, mxcsr, r15, r14, r13 = entry, r12 = arg, rbx, rbp, return = start.
static void* initial_stack(char* top, Fiber::Entry entry, void* arg) {
  auto* s = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15));
  *--s = 0;
  *--s = reinterpret_cast<uint64_t>(&mq_fiber_start_asm);
  *--s = 0;                                     // rbp
  *--s = 0;                                     // rbx
  *--s = reinterpret_cast<uint64_t>(arg);       // r12
  *--s = reinterpret_cast<uint64_t>(entry);     // r13
  *--s = 0;                                     // r14
  *--s = 0;                                     // r15
  *--s = 0x1F80;                                // mxcsr: default rounding, exceptions masked
  *--s = 0x037F;                                // x87 control word default
  return s;
}

#elif defined(__aarch64__)
// Saves the AAPCS64 callee-saved registers x19-x30 and d8-d15 (160 bytes).
asm(".text\n.p2align 2\n"
    ".globl " MQ_ASM_SYM(mq_fiber_switch_asm) "\n" MQ_ASM_TYPE(mq_fiber_switch_asm)
    MQ_ASM_SYM(mq_fiber_switch_asm) ":\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n  str x2, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n  ret\n"
    ".globl " MQ_ASM_SYM(mq_fiber_start_asm) "\n" MQ_ASM_TYPE(mq_fiber_start_asm)
    MQ_ASM_SYM(mq_fiber_start_asm) ":\n"
    "  mov x0, x19\n  blr x20\n  brk #0\n");

// A fresh frame as mq_fiber_switch_asm loads it: x19 = arg, x20 = entry,
// x29 = 0, x30 = start; everything else zero.
static void* initial_stack(char* top, Fiber::Entry entry, void* arg) {
  auto* s = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15)) - 160);
  for (int i = 0; i < 20; ++i) s[i] = 0;
  s[0] = reinterpret_cast<uint64_t>(arg);
  s[1] = reinterpret_cast<uint64_t>(entry);
  s[11] = reinterpret_cast<uint64_t>(&mq_fiber_start_asm);
  return s;
}
#endif

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
