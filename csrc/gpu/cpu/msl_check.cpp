#include "msl_check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "../device.h"
#include "msl_preprocess.h"
#include "msl_strict_source.h"

namespace mq::cpu {
namespace {

// Only Metal-relevant warnings are errors, so clang's noise (its own line markers, the
// stub's literal suffixes) stays out of the diagnostics. Metal has no exceptions, no RTTI;
// arm64 gives half and bfloat stand-ins clang accepts.
#define MQ_CHECK_COMMON_FLAGS                                                                               \
  "-fsyntax-only -target arm64-apple-macos14 -nostdinc -fno-exceptions -fno-rtti "                          \
  "-Werror=unknown-attributes -Wno-user-defined-literals -Wno-unknown-warning-option -Wno-gnu-line-marker " \
  "-fno-caret-diagnostics"

// MSL 3.1 is C++14 with Metal's restrictions: address spaces as clang address spaces
// (thread the default), C++17 refused.
const char kCxx14Flags[] =
    "-x c++ -std=c++14 -nostdinc++ -pedantic-errors -Werror=missing-variable-declarations " MQ_CHECK_COMMON_FLAGS;

// Apple's address-space rules are clang's OpenCL ones: C++ for OpenCL 2021 without
// program-scope global variables refuses a program-scope, static member or static local
// variable outside constant. Generic pointers stay on (without them clang cannot copy a
// struct into a by-value parameter); the C++14 pass holds unqualified pointers to thread.
const char kOpenclFlags[] =
    "-x clcpp -cl-std=clc++2021 -cl-no-stdinc -Xclang "
    "-cl-ext=-__opencl_c_program_scope_global_variables,+__opencl_c_generic_address_space,-__opencl_c_pipes,"
    "-__opencl_c_device_enqueue,+cl_khr_fp16,+cl_khr_fp64,+__opencl_c_fp64 " MQ_CHECK_COMMON_FLAGS;
#undef MQ_CHECK_COMMON_FLAGS

// Apple's own compiler (macOS with Xcode's Metal toolchain): errors only, as Metal does.
const char kXcrunFlags[] = "metal -std=metal3.1 -fsyntax-only";

struct Tool {
  std::string command;   // "" when none was found
  std::string identity;  // its --version text, part of the cache key
};

// clang >= 14 (14 and 16 are tested), looked for once.
const Tool& clang() {
  static const Tool found = [] {
    const char* env = std::getenv("METALQWEN_CLANG");
    const std::string cmd = env && *env ? env : "clang++";
    auto [status, version] = run_command(shell_quote(cmd) + " --version");
    if (status != 0 || version.find("clang") == std::string::npos) return Tool{};
    auto [major_status, major] = run_command(shell_quote(cmd) + " -dumpversion");
    if (major_status != 0 || std::atoi(major.c_str()) < 14) return Tool{};
    return Tool{cmd, version};
  }();
  return found;
}

// `xcrun` where it finds Apple's `metal` compiler, looked for once.
const Tool& xcrun_metal() {
  static const Tool found = [] {
    auto [status, path] = run_command("xcrun --find metal");
    if (status != 0 || path.empty()) return Tool{};
    auto [version_status, version] = run_command("xcrun metal --version");
    return version_status == 0 ? Tool{"xcrun", version} : Tool{};
  }();
  return found;
}

// Apple's compiler where xcrun finds it, unless METALQWEN_MSL_CHECKER=clang asks for the
// clang passes (as the tests of their rules do); else the clang passes; null when neither.
const Tool* checker() {
  const char* choice = std::getenv("METALQWEN_MSL_CHECKER");
  const bool clang_only = choice && std::string(choice) == "clang";
  if (!clang_only && !xcrun_metal().command.empty()) return &xcrun_metal();
  return clang().command.empty() ? nullptr : &clang();
}

const Tool& required_checker() {
  if (!checker())
    throw gpu::GpuError(
        "[msl-check] the MSL check needs clang >= 14 (or Apple's compiler, xcrun metal): install clang, or name it "
        "in METALQWEN_CLANG (METALQWEN_CHECK_MSL=0 compiles without the check)");
  return *checker();
}

// Writes `text` to a new file in the cache directory; returns its path.
std::string write_temporary(const std::string& text, const std::string& suffix, const Toolchain& tools) {
  std::string path = tools.cache_dir + "/msl-check-XXXXXX" + suffix;
  const int fd = mkstemps(path.data(), int(suffix.size()));
  if (fd < 0) throw gpu::GpuError("[msl-check] cannot create a file in " + tools.cache_dir);
  const bool written = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  if (!written) {
    std::remove(path.c_str());
    throw gpu::GpuError("[msl-check] cannot write " + path);
  }
  return path;
}

void run_xcrun_check(const std::string& source, const std::string& source_name, const Toolchain& tools) {
  const std::string path = write_temporary("#line 1 \"" + source_name + "\"\n" + source, ".metal", tools);
  auto [status, diagnostics] = run_command("xcrun " + std::string(kXcrunFlags) + " " + shell_quote(path));
  std::remove(path.c_str());
  if (status != 0)
    throw gpu::CompileError("[msl-check] " + source_name + ": Apple's Metal compiler (xcrun metal) rejects this MSL",
                            diagnostics);
}

// The C++14 pass, then the C++-for-OpenCL pass, over one prepared text; the first to fail
// gives the diagnostics.
void run_clang_checks(const std::string& source, const std::string& source_name, const Toolchain& tools) {
  const std::string path = write_temporary(strict_check_source(preprocess_msl(source, source_name, tools)), ".cpp",
                                           tools);
  const std::string stubs = tools.include_dir + "/msl_strict";
  auto [status, diagnostics] = run_command(shell_quote(clang().command) + " " + kCxx14Flags + " -I" +
                                           shell_quote(stubs) + " " + shell_quote(path));
  const char* pass = "C++14 pass";
  if (status == 0) {
    std::tie(status, diagnostics) = run_command(shell_quote(clang().command) + " " + kOpenclFlags + " -I" +
                                                shell_quote(tools.include_dir + "/msl_opencl") + " -I" +
                                                shell_quote(stubs) + " " + shell_quote(path));
    pass = "C++ for OpenCL pass";
  }
  std::remove(path.c_str());
  if (status == 0) return;
  // clang's C++ cannot copy a struct between address spaces, which Metal allows: say so.
  const bool struct_copy = diagnostics.find("expects object in generic address space") != std::string::npos ||
                           diagnostics.find("construct an object in address space") != std::string::npos;
  throw gpu::CompileError(
      "[msl-check] " + source_name + ": Apple's Metal compiler would reject this MSL (" + pass + ")" +
          (struct_copy ? " (except a whole-struct copy between address spaces, which only this check refuses: "
                         "copy such a struct field by field)"
                       : "") +
          " (METALQWEN_CHECK_MSL=0 skips the check)",
      diagnostics);
}

void run_check(const Tool& tool, const std::string& source, const std::string& source_name, const Toolchain& tools) {
  if (&tool == &xcrun_metal()) run_xcrun_check(source, source_name, tools);
  else run_clang_checks(source, source_name, tools);
}

}  // namespace

void check_msl(const std::string& source, const std::string& source_name) {
  run_check(required_checker(), source, source_name, toolchain());
}

void check_msl_for_compile(const std::string& source, const std::string& source_name, const Toolchain& tools,
                           uint64_t source_key) {
  const char* mode = std::getenv("METALQWEN_CHECK_MSL");
  const char* ci = std::getenv("CI");
  if (mode && std::string(mode) == "0") return;
  const bool required = (mode && std::string(mode) == "1") || (ci && std::string(ci) == "true");
  if (!checker() && !required) return;
  const Tool& tool = required_checker();
  const std::string flags = &tool == &xcrun_metal() ? std::string(kXcrunFlags)
                                                    : std::string(kCxx14Flags) + kOpenclFlags;
  // The include directory's name carries the stubs' content version.
  const std::string passed = tools.cache_dir + "/" + hex(fnv1a(tool.identity + flags + tools.include_dir, source_key)) +
                             ".msl-ok";
  if (file_exists(passed)) return;
  run_check(tool, source, source_name, tools);
  write_file_atomically(passed, "");
}

}  // namespace mq::cpu
