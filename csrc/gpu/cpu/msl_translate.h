// MSL -> C++ for the CPU runtime: the (preprocessed, msl_preprocess.h) source keeps its
// lines (#line and line markers point at the .metal text), gains the compatibility
// header in front and one entry point per kernel plus the library's export table.
#pragma once
#include <string>
#include <vector>

namespace mq::cpu {

struct TranslatedSource {
  std::string cpp;
  std::vector<std::string> kernel_names;
};

// Throws mq::gpu::CompileError for MSL the CPU runtime cannot run.
TranslatedSource translate_msl(const std::string& source, const std::string& source_name);

}  // namespace mq::cpu
