#include "division_fault.h"

#if defined(__x86_64__) && defined(__linux__)
#include <signal.h>
#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#endif

namespace mq::cpu {
namespace {
// initial-exec: read from a signal handler, so it must never be allocated lazily.
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_kernel = false;
}  // namespace

KernelDivisionScope::KernelDivisionScope() : outer_(t_in_kernel) { t_in_kernel = true; }
KernelDivisionScope::~KernelDivisionScope() { t_in_kernel = outer_; }

#if defined(__x86_64__) && defined(__linux__)
namespace {

struct sigaction g_previous;  // the handler installed before ours

// Machine register number (rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15) -> gregs index.
constexpr int kGreg[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                           REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

// A decoded `div`/`idiv` (opcode F6 /6 /7 or F7 /6 /7) and its divisor.
struct Division {
  bool is_signed;
  int bits;            // operand size: 8, 16, 32, 64
  int64_t divisor;     // sign-extended for idiv, zero-extended for div
  unsigned length;     // instruction bytes
};

uint64_t truncate_to(uint64_t v, int bits) { return bits == 64 ? v : v & ((uint64_t(1) << bits) - 1); }
int64_t sign_extend(uint64_t v, int bits) { return bits == 64 ? int64_t(v) : int64_t(v << (64 - bits)) >> (64 - bits); }

// Decodes the instruction at rip: legacy prefixes, REX, opcode, ModRM, SIB, displacement.
bool decode_division(const greg_t* gregs, Division& out) {
  const auto* code = reinterpret_cast<const uint8_t*>(gregs[REG_RIP]);
  unsigned at = 0;
  bool operand16 = false, address32 = false;
  for (;; ++at) {
    const uint8_t p = code[at];
    if (p == 0x66) operand16 = true;
    else if (p == 0x67) address32 = true;
    else if (p == 0x64 || p == 0x65) return false;  // fs/gs-relative divisor: not ours to read
    else if (p != 0xF0 && p != 0xF2 && p != 0xF3 && p != 0x2E && p != 0x36 && p != 0x3E && p != 0x26) break;
    if (at > 14) return false;
  }
  uint8_t rex = 0;
  if ((code[at] & 0xF0) == 0x40) rex = code[at++];
  const uint8_t opcode = code[at++];
  if (opcode != 0xF6 && opcode != 0xF7) return false;
  const uint8_t modrm = code[at++];
  const int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
  if (reg != 6 && reg != 7) return false;
  out.is_signed = reg == 7;
  out.bits = opcode == 0xF6 ? 8 : (rex & 8) ? 64 : operand16 ? 16 : 32;

  uint64_t value;
  if (mod == 3) {
    const int r = rm + ((rex & 1) ? 8 : 0);
    // Without REX, byte registers 4..7 are ah, ch, dh, bh.
    if (out.bits == 8 && !rex && rm >= 4) value = uint64_t(gregs[kGreg[rm - 4]]) >> 8;
    else value = uint64_t(gregs[kGreg[r]]);
  } else {
    uint64_t address = 0;
    int32_t displacement = 0;
    bool rip_relative = false;
    if (rm == 4) {  // SIB
      const uint8_t sib = code[at++];
      const int scale = sib >> 6, index = ((sib >> 3) & 7) + ((rex & 2) ? 8 : 0), base = sib & 7;
      if (index != 4) address += uint64_t(gregs[kGreg[index]]) << scale;
      if (base == 5 && mod == 0) {
        std::memcpy(&displacement, code + at, 4);
        at += 4;
      } else {
        address += uint64_t(gregs[kGreg[base + ((rex & 1) ? 8 : 0)]]);
      }
    } else if (rm == 5 && mod == 0) {
      rip_relative = true;
      std::memcpy(&displacement, code + at, 4);
      at += 4;
    } else {
      address += uint64_t(gregs[kGreg[rm + ((rex & 1) ? 8 : 0)]]);
    }
    if (mod == 1) displacement = int8_t(code[at++]);
    if (mod == 2) {
      std::memcpy(&displacement, code + at, 4);
      at += 4;
    }
    address += uint64_t(int64_t(displacement));
    if (rip_relative) address += uint64_t(gregs[REG_RIP]) + at;  // relative to the next instruction
    if (address32) address &= 0xFFFFFFFFu;
    std::memcpy(&value, reinterpret_cast<const void*>(address), out.bits / 8);
  }
  value = truncate_to(value, out.bits);
  out.divisor = out.is_signed ? sign_extend(value, out.bits) : int64_t(value);
  out.length = at;
  return true;
}

// Writes the quotient and remainder where the instruction would have: al/ah for 8 bits,
// ax/dx (upper bits kept) for 16, eax/edx (zero-extended) for 32, rax/rdx for 64.
void set_results(greg_t* gregs, int bits, uint64_t quotient, uint64_t remainder) {
  auto& rax = reinterpret_cast<uint64_t&>(gregs[REG_RAX]);
  auto& rdx = reinterpret_cast<uint64_t&>(gregs[REG_RDX]);
  if (bits == 8) {
    rax = (rax & ~uint64_t(0xFFFF)) | truncate_to(quotient, 8) | (truncate_to(remainder, 8) << 8);
  } else if (bits == 16) {
    rax = (rax & ~uint64_t(0xFFFF)) | truncate_to(quotient, 16);
    rdx = (rdx & ~uint64_t(0xFFFF)) | truncate_to(remainder, 16);
  } else {
    rax = truncate_to(quotient, bits);
    rdx = truncate_to(remainder, bits);
  }
}

void take_default_action(int sig) {
  signal(sig, SIG_DFL);
  raise(sig);  // delivered once the handler returns (a hardware fault also repeats then)
}

void chain_to_previous(int sig, siginfo_t* info, void* context) {
  // A previous handler that chains back to us (it saved ours) would loop forever.
  static __attribute__((tls_model("initial-exec"))) thread_local bool chaining = false;
  if (chaining) return take_default_action(sig);
  chaining = true;
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    take_default_action(sig);  // also for SIG_IGN: an ignored division fault would repeat forever
  }
  chaining = false;
}

void on_sigfpe(int sig, siginfo_t* info, void* context) {
  auto* gregs = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
  Division d;
  if (!t_in_kernel || info->si_code <= 0 || !decode_division(gregs, d)) return chain_to_previous(sig, info, context);
  // The dividend is the low half (al, ax, eax, rax): compilers extend it into the high half.
  const uint64_t dividend = truncate_to(uint64_t(gregs[REG_RAX]), d.bits);
  if (d.divisor == 0) {
    set_results(gregs, d.bits, 0, dividend);
  } else if (d.is_signed && d.divisor == -1) {
    set_results(gregs, d.bits, 0 - dividend, 0);  // only INT_MIN overflows: INT_MIN / -1 = INT_MIN
  } else {
    return chain_to_previous(sig, info, context);  // a quotient wider than the operand: not compiler code
  }
  gregs[REG_RIP] += d.length;
}

}  // namespace

void install_division_fault_handler() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  struct sigaction current;
  sigaction(SIGFPE, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &on_sigfpe) return;
  struct sigaction ours;
  std::memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = &on_sigfpe;
  ours.sa_flags = SA_SIGINFO;
  sigemptyset(&ours.sa_mask);
  sigaction(SIGFPE, &ours, &g_previous);
}

#else
void install_division_fault_handler() {}  // aarch64 divides by zero without a fault

#endif

}  // namespace mq::cpu
