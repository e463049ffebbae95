// The C preprocessor over MSL, before translation: kernels, parameters and threadgroup
// arrays that macros produce reach the translator as Metal's compiler would see them.
#pragma once
#include <string>

#include "toolchain.h"

namespace mq::cpu {

// The preprocessing flags; part of the cache key of a raw source.
extern const char kMslPreprocessFlags[];

// Expands macros and conditionals. The Metal headers are empty stand-ins at this stage,
// so their macros (INFINITY, M_PI_F, ...) are left for the real compile to expand.
// The result keeps line markers (`# N "file"`) and starts at line 1 of `source_name`.
// Throws gpu::CompileError with the preprocessor's diagnostics (#error, missing include).
std::string preprocess_msl(const std::string& source, const std::string& source_name, const Toolchain& tools);

}  // namespace mq::cpu
