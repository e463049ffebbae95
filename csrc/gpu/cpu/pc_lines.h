// Maps an instruction of a compiled kernel library back to its MSL line, for the checking
// mode's reports: the checking variant carries debug info whose lines are the .metal lines
// (the translated C++ keeps #line), read with addr2line (binutils or llvm-addr2line).
#pragma once
#include <string>

namespace mq::cpu {

// "file.metal:line" of the innermost inlined MSL frame (not a compatibility header), with
// the kernel's own line when that frame is an inlined helper: "a.metal:44 (inlined at a.metal:218)";
// or "<library>+0x<offset>" when no line is known. Slow (runs a tool); memoised.
std::string msl_line_of(const void* pc);

}  // namespace mq::cpu
