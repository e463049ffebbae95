#include "msl_check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "../device.h"
#include "msl_preprocess.h"
#include "msl_strict_source.h"

namespace mq::cpu {
namespace {

// MSL 3.1 is C++14 with Metal's restrictions: no exceptions, no RTTI; arm64 gives half and
// bfloat stand-ins clang accepts. Only Metal-relevant warnings are errors, so clang's
// noise (its own line markers, the stub's literal suffixes) stays out of the diagnostics.
const char kStrictFlags[] =
    "-x c++ -std=c++14 -pedantic-errors -fsyntax-only -target arm64-apple-macos14 -nostdinc -nostdinc++ "
    "-fno-exceptions -fno-rtti -Werror=unknown-attributes -Werror=missing-variable-declarations "
    "-Wno-user-defined-literals -Wno-unknown-warning-option -Wno-gnu-line-marker -fno-caret-diagnostics";

struct Clang {
  std::string command;   // "" when none was found
  std::string identity;  // its --version text, part of the cache key
};

// clang >= 14 (14 and 16 are tested), looked for once.
const Clang& clang() {
  static const Clang found = [] {
    const char* env = std::getenv("METALQWEN_CLANG");
    const std::string cmd = env && *env ? env : "clang++";
    auto [status, version] = run_command(shell_quote(cmd) + " --version");
    if (status != 0 || version.find("clang") == std::string::npos) return Clang{};
    auto [major_status, major] = run_command(shell_quote(cmd) + " -dumpversion");
    if (major_status != 0 || std::atoi(major.c_str()) < 14) return Clang{};
    return Clang{cmd, version};
  }();
  return found;
}

const Clang& required_clang() {
  if (clang().command.empty())
    throw gpu::GpuError(
        "[msl-check] the MSL check needs clang >= 14: install clang, or name it in METALQWEN_CLANG "
        "(METALQWEN_CHECK_MSL=0 compiles without the check)");
  return clang();
}

void run_check(const std::string& source, const std::string& source_name, const Toolchain& tools) {
  const std::string text = strict_check_source(preprocess_msl(source, source_name, tools));
  std::string path = tools.cache_dir + "/msl-check-XXXXXX.cpp";
  const int fd = mkstemps(path.data(), 4);
  if (fd < 0) throw gpu::GpuError("[msl-check] cannot create a file in " + tools.cache_dir);
  const bool written = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  if (!written) {
    std::remove(path.c_str());
    throw gpu::GpuError("[msl-check] cannot write " + path);
  }
  auto [status, diagnostics] = run_command(shell_quote(clang().command) + " " + kStrictFlags + " -I" +
                                           shell_quote(tools.include_dir + "/msl_strict") + " " + shell_quote(path));
  std::remove(path.c_str());
  if (status == 0) return;
  // clang's C++ cannot copy a struct between address spaces, which Metal allows: say so.
  const bool struct_copy = diagnostics.find("expects object in generic address space") != std::string::npos ||
                           diagnostics.find("construct an object in address space") != std::string::npos;
  throw gpu::CompileError(
      "[msl-check] " + source_name + ": Apple's Metal compiler would reject this MSL" +
          (struct_copy ? " (except a whole-struct copy between address spaces, which only this check refuses: "
                         "copy such a struct field by field)"
                       : "") +
          " (METALQWEN_CHECK_MSL=0 skips the check)",
      diagnostics);
}

}  // namespace

void check_msl(const std::string& source, const std::string& source_name) {
  required_clang();
  run_check(source, source_name, toolchain());
}

void check_msl_for_compile(const std::string& source, const std::string& source_name, const Toolchain& tools,
                           uint64_t source_key) {
  const char* mode = std::getenv("METALQWEN_CHECK_MSL");
  const char* ci = std::getenv("CI");
  if (mode && std::string(mode) == "0") return;
  const bool required = (mode && std::string(mode) == "1") || (ci && std::string(ci) == "true");
  if (clang().command.empty() && !required) return;
  required_clang();
  const std::string passed = tools.cache_dir + "/" + hex(fnv1a(clang().identity + kStrictFlags, source_key)) + ".msl-ok";
  if (file_exists(passed)) return;
  run_check(source, source_name, tools);
  write_file_atomically(passed, "");
}

}  // namespace mq::cpu
