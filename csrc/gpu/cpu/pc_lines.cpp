#include "pc_lines.h"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "toolchain.h"

namespace mq::cpu {
namespace {

std::string hex_offset(uintptr_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

// The MSL frames of addr2line -i's output ("file:line" per inlined frame, innermost first):
// compatibility headers and the generated entry glue are left out.
std::vector<std::string> msl_frames(const std::string& addr2line_output) {
  const Toolchain tools = toolchain();
  const std::string compiled_in = tools.cache_dir + "/";  // kernel_compiler.cpp compiles there
  std::vector<std::string> frames;
  std::istringstream lines(addr2line_output);
  for (std::string frame; std::getline(lines, frame);) {
    frame = frame.substr(0, frame.find(" (discriminator"));
    const bool header = frame.rfind(tools.include_dir, 0) == 0 || frame.find("<metalqwen") != std::string::npos;
    const bool unknown = frame.rfind("??", 0) == 0 || frame.size() < 2 || frame.substr(frame.size() - 2) == ":0" ||
                         frame.back() == '?';
    if (header || unknown) continue;
    frames.push_back(frame.rfind(compiled_in, 0) == 0 ? frame.substr(compiled_in.size()) : frame);
  }
  return frames;
}

// "line" or, inside an inlined MSL helper, "line (inlined into kernel line)".
std::string lookup(const std::string& library, uintptr_t offset) {
  for (const char* tool : {"addr2line", "llvm-addr2line"}) {
    auto [status,
          output] = run_command(std::string(tool) + " -i -e " + shell_quote(library) + " " + hex_offset(offset));
    if (status != 0) continue;
    const std::vector<std::string> frames = msl_frames(output);
    if (frames.empty()) return "";
    return frames.size() == 1 ? frames[0] : frames.front() + " (inlined at " + frames.back() + ")";
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
