// Compiles translated MSL into a shared object with the system C++ compiler,
// caches it on disk by content hash and loads it.
#pragma once
#include <memory>
#include <string>

#include "abi.h"

namespace mq::cpu {

// A loaded kernel library; unloaded when the last user lets go.
class LoadedLibrary {
 public:
  LoadedLibrary(void* handle, const mq_abi::LibraryExports* exports) : handle_(handle), exports_(exports) {}
  ~LoadedLibrary();
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  const mq_abi::LibraryExports& exports() const { return *exports_; }

 private:
  void* handle_;
  const mq_abi::LibraryExports* exports_;
};

// Compiler: METALQWEN_CXX, else c++ (g++ >= 12 or clang >= 15).
// Cache: METALQWEN_CACHE_DIR, else $XDG_CACHE_HOME/metalqwen or ~/.cache/metalqwen.
// Throws gpu::CompileError with the compiler's diagnostics.
std::shared_ptr<LoadedLibrary> build_library(const std::string& cpp_source);

}  // namespace mq::cpu
