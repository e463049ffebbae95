// Integer division by zero inside a kernel yields a value, as on a GPU, instead of
// killing the process: on x86_64 a SIGFPE handler completes the faulting div/idiv
// with the results aarch64 gives natively (x / 0 = 0, x % 0 = x, INT_MIN / -1 = INT_MIN,
// INT_MIN % -1 = 0). Elsewhere (aarch64) the hardware already does this.
#pragma once

namespace mq::cpu {

// Marks the calling OS thread as running kernel code while it lives; the handler
// leaves faults on other threads (and outside the scope) to the previous handler.
class KernelDivisionScope {
 public:
  KernelDivisionScope();
  ~KernelDivisionScope();
  KernelDivisionScope(const KernelDivisionScope&) = delete;
  KernelDivisionScope& operator=(const KernelDivisionScope&) = delete;

 private:
  bool outer_;
};

// Installs the handler unless it is the current one (someone may have replaced it since,
// e.g. Python's faulthandler; it then becomes the previous handler). Call before a dispatch.
void install_division_fault_handler();

}  // namespace mq::cpu
