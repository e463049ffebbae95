// The fiber context switch in assembly for x86_64 (System V) and aarch64 (AAPCS64,
// Apple silicon), with the initial frame each expects. The floating-point control state is
// not switched: every fiber of an OS thread runs under DefaultFloatingPoint (fiber.h). Self-contained (stdint only)
// so tests can assemble it for every target we ship, arm64-apple-macos included.
#pragma once
#include <stdint.h>

namespace mq::cpu {

// ELF: hidden, so the runtime calls the switch directly, not through the PLT.
#if defined(__APPLE__)
#define MQ_ASM_SYM(name) "_" #name
#define MQ_ASM_TYPE(name) ""
#else
#define MQ_ASM_SYM(name) #name
#define MQ_ASM_TYPE(name) ".hidden " #name "\n.type " #name ",@function\n"
#endif

extern "C" __attribute__((visibility("hidden"))) void mq_fiber_switch_asm(void** save_sp, void* load_sp);
extern "C" __attribute__((visibility("hidden"))) void mq_fiber_start_asm();

#if defined(__x86_64__)
// Saves the System V callee-saved general registers.
asm(".text\n"
    ".globl " MQ_ASM_SYM(mq_fiber_switch_asm) "\n" MQ_ASM_TYPE(mq_fiber_switch_asm)
    MQ_ASM_SYM(mq_fiber_switch_asm) ":\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".globl " MQ_ASM_SYM(mq_fiber_start_asm) "\n" MQ_ASM_TYPE(mq_fiber_start_asm)
    MQ_ASM_SYM(mq_fiber_start_asm) ":\n"
    "  movq %r12, %rdi\n  andq $-16, %rsp\n  callq *%r13\n  ud2\n");

// A fresh stack, lowest address first, as mq_fiber_switch_asm pops it:
// r15, r14, r13 = entry, r12 = arg, rbx, rbp, return = start.
inline void* initial_stack(char* top, void (*entry)(void*), void* arg) {
  auto* s = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15));
  *--s = 0;
  *--s = reinterpret_cast<uint64_t>(&mq_fiber_start_asm);
  *--s = 0;                                     // rbp
  *--s = 0;                                     // rbx
  *--s = reinterpret_cast<uint64_t>(arg);       // r12
  *--s = reinterpret_cast<uint64_t>(entry);     // r13
  *--s = 0;                                     // r14
  *--s = 0;                                     // r15
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
inline void* initial_stack(char* top, void (*entry)(void*), void* arg) {
  auto* s = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15)) - 160);
  for (int i = 0; i < 20; ++i) s[i] = 0;
  s[0] = reinterpret_cast<uint64_t>(arg);
  s[1] = reinterpret_cast<uint64_t>(entry);
  s[11] = reinterpret_cast<uint64_t>(&mq_fiber_start_asm);
  return s;
}
#endif

}  // namespace mq::cpu
