#include "shader_source.h"

#include <sstream>
#include <stdexcept>

#include "../../shaders/instances.h"
#include "../../shaders/params.h"
#include "common/embedded_files.h"

namespace mq::engine {
namespace {

// Appends `path` with its local includes inlined; `done` gives #pragma once semantics.
void append_file(const std::map<std::string, std::string>& files, const std::string& path, std::set<std::string>& done,
                 std::string& out) {
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

// One kernel of the tables: its family (<family>.h holds its body) and, for a template
// instance, the instantiation MSL line (empty for a plain kernel).
struct KernelEntry {
  std::string name, family, instance;
};

// The tables of shaders/instances.h, in family then table order.
const std::vector<KernelEntry>& kernel_table() {
  static const std::vector<KernelEntry> table = [] {
    std::vector<KernelEntry> t;
    std::string family;
    auto instance = [&](const std::string& name, const std::string& func, const std::string& args) {
      const std::string f = func + "<" + args + ">";
      t.push_back({name, family, "template [[host_name(\"" + name + "\")]] [[kernel]] decltype(" + f + ") " + f + ";"});
    };
#define MQ_TABLE_INSTANCE(name, func, ...) instance(name, #func, #__VA_ARGS__);
#define MQ_TABLE_PLAIN(name) t.push_back({#name, family, ""});
    // Per weight format: the format tables, expanded over MQ_WEIGHT_FORMATS.
#define MQ_TABLE_QUANT(F, ...) MQ_QUANT_FORMAT_KERNELS(MQ_TABLE_INSTANCE, F, __VA_ARGS__)
#define MQ_TABLE_QMV_NORM(F, ...) MQ_QMV_NORM_FORMAT_KERNELS(MQ_TABLE_INSTANCE, F, __VA_ARGS__)
#define MQ_TABLE_QMV_HEAD_NORM(F, ...) MQ_QMV_HEAD_NORM_FORMAT_KERNELS(MQ_TABLE_INSTANCE, F, __VA_ARGS__)
#define MQ_TABLE_MOE(F, ...) MQ_MOE_FORMAT_KERNELS(MQ_TABLE_INSTANCE, F, __VA_ARGS__)
    family = "attention";
    MQ_ATTENTION_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "copy";
    MQ_COPY_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "dflash";
    MQ_DFLASH_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "deltanet";
    MQ_DELTANET_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "moe";
    MQ_MOE_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    MQ_WEIGHT_FORMATS(MQ_TABLE_MOE)
    family = "norm";
    MQ_NORM_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "qmv_head_norm";
    MQ_WEIGHT_FORMATS(MQ_TABLE_QMV_HEAD_NORM)
    family = "qmv_norm";
    MQ_WEIGHT_FORMATS(MQ_TABLE_QMV_NORM)
    family = "quant";
    MQ_WEIGHT_FORMATS(MQ_TABLE_QUANT)
    family = "sampling";
    MQ_SAMPLING_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    family = "vision";
    MQ_VISION_KERNELS(MQ_TABLE_INSTANCE, MQ_TABLE_PLAIN)
    return t;
  }();
  return table;
}

}  // namespace

std::string assemble_shader_library(const std::map<std::string, std::string>& files) {
  std::string out;
  std::set<std::string> done;
  for (const auto& [path, text] : files)
    if (path.size() > 6 && path.compare(path.size() - 6, 6, ".metal") == 0) append_file(files, path, done, out);
  return out;
}

std::string assemble_kernel_library(const std::map<std::string, std::string>& files,
                                    const std::set<std::string>& kernels) {
  std::set<std::string> families, found;
  std::string instances;
  for (const KernelEntry& k : kernel_table()) {
    if (!kernels.count(k.name)) continue;
    found.insert(k.name);
    families.insert(k.family);
    if (!k.instance.empty()) instances += k.instance + "\n";
  }
  for (const std::string& name : kernels)
    if (!found.count(name)) throw std::runtime_error("[shaders] no kernel named '" + name + "' in the library");
  std::string out;
  std::set<std::string> done;
  for (const std::string& family : families) append_file(files, family + ".h", done, out);
  return out + "#line 1 \"<metalqwen kernel instances>\"\n" + instances;
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const KernelEntry& k : kernel_table()) names.push_back(k.name);
  return names;
}

std::vector<std::string> weight_formats() {
  std::vector<std::string> names;
#define MQ_FORMAT_NAME(F, ...) names.push_back(#F);
  MQ_WEIGHT_FORMATS(MQ_FORMAT_NAME)
  return names;
}

const std::map<std::string, std::string>& embedded_shader_files() {
  static const std::map<std::string, std::string> files = [] {
    std::map<std::string, std::string> f;
    for (size_t i = 0; i < kShaderFiles.count; ++i) f[kShaderFiles.files[i].path] = kShaderFiles.files[i].text;
    return f;
  }();
  return files;
}

std::string embedded_shader_key() { return kShaderFiles.key; }

const std::string& embedded_shader_library() {
  static const std::string source = assemble_shader_library(embedded_shader_files());
  return source;
}

}  // namespace mq::engine
