#include "shader_source.h"

#include <set>
#include <sstream>
#include <stdexcept>

#include "common/embedded_files.h"

namespace mq::engine {
namespace {

// Appends `path` with its local includes inlined; `done` gives #pragma once semantics.
void append_file(const std::map<std::string, std::string>& files, const std::string& path,
                 std::set<std::string>& done, std::string& out) {
  auto it = files.find(path);
  if (it == files.end()) throw std::runtime_error("[shaders] missing shader file '" + path + "'");
  if (!done.insert(path).second) return;
  out += "#line 1 \"shaders/" + path + "\"\n";
  std::istringstream lines(it->second);
  std::string line;
  for (unsigned number = 1; std::getline(lines, line); ++number) {
    size_t q0 = line.find('"'), q1 = line.rfind('"');
    bool local_include = line.rfind("#include \"", 0) == 0 && q1 > q0;
    if (!local_include) {
      out += line.rfind("#pragma once", 0) == 0 ? "\n" : line + "\n";
      continue;
    }
    append_file(files, line.substr(q0 + 1, q1 - q0 - 1), done, out);
    out += "#line " + std::to_string(number + 1) + " \"shaders/" + path + "\"\n";
  }
}

}  // namespace

std::string assemble_shader_library(const std::map<std::string, std::string>& files) {
  std::string out;
  std::set<std::string> done;
  for (const auto& [path, text] : files)
    if (path.size() > 6 && path.compare(path.size() - 6, 6, ".metal") == 0) append_file(files, path, done, out);
  return out;
}

const std::string& embedded_shader_library() {
  static const std::string source = [] {
    std::map<std::string, std::string> files;
    for (size_t i = 0; i < kShaderFiles.count; ++i) files[kShaderFiles.files[i].path] = kShaderFiles.files[i].text;
    return assemble_shader_library(files);
  }();
  return source;
}

}  // namespace mq::engine
