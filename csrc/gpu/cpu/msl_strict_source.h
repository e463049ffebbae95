// The text the MSL check (msl_check.h) gives clang: preprocessed MSL with the few
// constructs plain C++ cannot express made expressible, lines kept, so clang's
// diagnostics point at the .metal lines.
#pragma once
#include <string>

namespace mq::cpu {

// From preprocessed MSL (line markers kept): Metal's attributes removed (an unknown one is
// left for clang to reject), `float4(a, b)` made a call clang can check, threadgroup
// variables of a kernel made static (clang refuses automatic variables in an address
// space) and any other threadgroup variable marked as the error it is in Metal.
std::string strict_check_source(const std::string& preprocessed_msl);

}  // namespace mq::cpu
