#include "pc_lines.h"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

#include "toolchain.h"

namespace mq::cpu {
namespace {

std::string hex_offset(uintptr_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

// addr2line -i prints one "file:line" per inlined frame, innermost first.
std::string lookup(const std::string& library, uintptr_t offset) {
  const std::string include_dir = toolchain().include_dir;
  for (const char* tool : {"addr2line", "llvm-addr2line"}) {
    auto [status, output] =
        run_command(std::string(tool) + " -i -e " + shell_quote(library) + " " + hex_offset(offset));
    if (status != 0) continue;
    std::istringstream frames(output);
    for (std::string frame; std::getline(frames, frame);) {
      const bool header = frame.rfind(include_dir, 0) == 0 || frame.find("<metalqwen") != std::string::npos;
      frame = frame.substr(0, frame.find(" (discriminator"));
      const bool unknown = frame.rfind("??", 0) == 0 || frame.size() < 2 || frame.substr(frame.size() - 2) == ":0" ||
                           frame.back() == '?';
      const std::string compiled_in = toolchain().cache_dir + "/";  // kernel_compiler.cpp compiles there
      if (!header && !unknown) return frame.rfind(compiled_in, 0) == 0 ? frame.substr(compiled_in.size()) : frame;
    }
  }
  return "";
}

}  // namespace

std::string msl_line_of(const void* pc) {
  Dl_info info{};
  if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "an unknown line";
  // A return address points after the call: step back into the accessing instruction's line.
  const uintptr_t offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
  const std::string where = std::string(info.dli_fname) + "+" + hex_offset(offset);
  static std::mutex mutex;
  static std::map<std::string, std::string> known;  // by library and offset: libraries come and go
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(where); it != known.end()) return it->second;
  const std::string line = lookup(info.dli_fname, offset);
  return known[where] = line.empty() ? where : line;
}

}  // namespace mq::cpu
