// The MSL strictness check. Where `xcrun --find metal` finds Apple's compiler it judges
// the MSL; elsewhere clang does, in two passes over the same prepared text
// (msl_strict_source.h): C++14 against a stub metal_stdlib whose address spaces are
// distinct clang address spaces (msl_strict/: address-space mix-ups, writes through
// constant, C++17, double, misplaced threadgroup variables, variable-length arrays,
// unknown attributes, kernels returning a value), then C++ for OpenCL with Metal's address
// spaces as OpenCL's (msl_opencl/: program-scope, static member and static local variables
// outside constant). What the CPU runtime's C++20 translation would accept but Apple's
// compiler rejects is refused here, with the .metal line.
#pragma once
#include <cstdint>
#include <string>

#include "toolchain.h"

namespace mq::cpu {

// Throws gpu::CompileError with the compiler's diagnostics; gpu::GpuError when neither
// xcrun's metal nor a clang >= 14 is found (METALQWEN_CLANG, else clang++ on PATH).
// METALQWEN_MSL_CHECKER=clang uses the clang passes where xcrun exists too.
void check_msl(const std::string& source, const std::string& source_name);

// The check on a CPU-runtime compile: METALQWEN_CHECK_MSL=0 turns it off; =1, or CI=true,
// makes a missing compiler an error; otherwise it runs where one is found. A source that
// passed is remembered in the cache under `source_key` (the compile's key for it).
void check_msl_for_compile(const std::string& source, const std::string& source_name, const Toolchain& tools,
                           uint64_t source_key);

}  // namespace mq::cpu
