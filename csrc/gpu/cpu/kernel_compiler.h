// Turns MSL into a loaded kernel library: preprocess (msl_preprocess.h), translate to
// C++ (msl_translate.h), compile into a shared object with the system compiler, load.
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

// Shared objects are cached on disk (toolchain.h) by the translated C++; a known raw
// source also skips preprocessing and translation. `source_name` is the name
// diagnostics and runtime errors give the MSL text.
// `checked` builds the variant whose loads and stores go through the access checker
// (a separate cached object). Throws gpu::CompileError with the preprocessor's or
// compiler's diagnostics.
std::shared_ptr<LoadedLibrary> build_library(const std::string& msl_source, const std::string& source_name,
                                             bool checked = false);

// What build_library would spend time on for this source, for a progress line: "" when
// the object is cached, else a sentence naming the compiler and the cache folder.
std::string library_build_notice(const std::string& msl_source, const std::string& source_name, bool checked = false);

}  // namespace mq::cpu
