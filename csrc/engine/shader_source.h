// The shader library as MSL text: Metal compiles source without include paths, so local
// #includes are inlined (once each) with #line kept exact. The whole library (every
// *.metal file), or the library of one model: the kernel headers its kernels need and only
// their instances (shaders/instances.h).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mq::engine {

// `files` maps paths relative to shaders/ ("params.h", "quant.metal") to text.
// Every *.metal file is included, in path order. Throws std::runtime_error on a
// missing include.
std::string assemble_shader_library(const std::map<std::string, std::string>& files);

// The kernels `kernels` (host names) and nothing else the headers do not define: each needed
// family's header (<family>.h, plain kernels included), then one line per template instance.
// Throws std::runtime_error naming a host name no family has.
std::string assemble_kernel_library(const std::map<std::string, std::string>& files,
                                    const std::set<std::string>& kernels);

// Every kernel host name of the library, and the weight formats' host-name suffixes
// (MQ_WEIGHT_FORMATS): the tables of shaders/instances.h.
std::vector<std::string> kernel_names();
std::vector<std::string> weight_formats();

// The shader files compiled into the extension, their key (a prebuilt library's must match:
// Device::prebuilt_library), and the whole library built from them.
const std::map<std::string, std::string>& embedded_shader_files();
std::string embedded_shader_key();
const std::string& embedded_shader_library();

}  // namespace mq::engine
