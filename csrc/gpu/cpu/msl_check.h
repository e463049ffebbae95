// The MSL strictness check: compiles MSL as C++14 with clang against a stub metal_stdlib
// (msl_strict/) whose address spaces are distinct clang address spaces, so what Apple's
// compiler rejects but the CPU runtime's C++20 translation would accept is refused here
// (address-space mix-ups, writes through constant, C++17, double, misplaced threadgroup
// variables, variable-length arrays, unknown attributes), with the .metal line.
#pragma once
#include <cstdint>
#include <string>

#include "toolchain.h"

namespace mq::cpu {

// Throws gpu::CompileError with clang's diagnostics; gpu::GpuError when no clang >= 14 is
// found (METALQWEN_CLANG, else clang++ on PATH).
void check_msl(const std::string& source, const std::string& source_name);

// The check on a CPU-runtime compile: METALQWEN_CHECK_MSL=0 turns it off; =1, or CI=true,
// makes a missing clang an error; otherwise it runs where clang is found. A source that
// passed is remembered in the cache under `source_key` (the compile's key for it).
void check_msl_for_compile(const std::string& source, const std::string& source_name, const Toolchain& tools,
                           uint64_t source_key);

}  // namespace mq::cpu
