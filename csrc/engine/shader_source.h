// The shader library as one MSL text: Metal compiles source without include
// paths, so local #includes are inlined (once each) with #line kept exact.
#pragma once
#include <map>
#include <string>

namespace mq::engine {

// `files` maps paths relative to shaders/ ("params.h", "quant.metal") to text.
// Every *.metal file is included, in path order. Throws std::runtime_error on a
// missing include.
std::string assemble_shader_library(const std::map<std::string, std::string>& files);

// The library built from the shaders compiled into the extension.
const std::string& embedded_shader_library();

}  // namespace mq::engine
