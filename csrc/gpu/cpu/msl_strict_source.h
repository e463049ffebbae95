// The text both clang passes of the MSL check (msl_check.h) compile: preprocessed MSL
// with the few constructs plain C++ cannot express made expressible, lines kept, so
// clang's diagnostics point at the .metal lines.
#pragma once
#include <string>

namespace mq::cpu {

// From preprocessed MSL (line markers kept): Metal's attributes and `kernel` removed (an
// unknown attribute is left for clang to reject), a kernel's return type wrapped so that
// only void compiles, `float4(a, b)` made a call clang can check, threadgroup variables of
// a kernel made references (clang refuses automatic variables in an address space) and
// any other threadgroup variable marked as the error it is in Metal.
std::string strict_check_source(const std::string& preprocessed_msl);

}  // namespace mq::cpu
