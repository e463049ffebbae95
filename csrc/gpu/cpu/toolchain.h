// The system C++ compiler and the on-disk kernel cache, shared by the CPU runtime's
// preprocessing (msl_preprocess.h) and compiling (kernel_compiler.h) steps.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

namespace mq::cpu {

struct Toolchain {
  std::string cxx;          // the compiler command
  std::string cxx_flags;    // what this compiler needs for GPU-like numerics (kernel builds)
  std::string identity;     // its --version text, part of every cache key
  std::string cache_dir;    // sources, objects and headers live here
  std::string include_dir;  // abi.h, msl/metal_stdlib, ... and the MSL check's msl_strict/, msl_opencl/
  std::string standin_dir;  // an empty file named like each msl/ header
};

// Compiler: METALQWEN_CXX, else c++ (g++ >= 12 or clang >= 16), checked once.
// Cache: METALQWEN_CACHE_DIR, else $XDG_CACHE_HOME/metalqwen or ~/.cache/metalqwen;
// created, with the headers written once per content version.
Toolchain toolchain();

// Runs a shell command; returns its exit status and combined output.
std::pair<int, std::string> run_command(const std::string& command);
std::string shell_quote(const std::string& s);

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull);
std::string hex(uint64_t v);
bool file_exists(const std::string& path);
std::string read_file(const std::string& path);  // "" when missing
// Through a temporary and a rename: concurrent processes never see half a file.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace mq::cpu
