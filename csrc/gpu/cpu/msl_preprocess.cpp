#include "msl_preprocess.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "../device.h"

namespace mq::cpu {

// C++20 as in the real compile; MSL 3.1 as msl/mq_kernel_glue.h declares it; no
// system headers (Metal has none), only the stand-ins.
const char kMslPreprocessFlags[] = "-E -x c++ -std=c++20 -nostdinc -D__METAL_VERSION__=310";

std::string preprocess_msl(const std::string& source, const std::string& source_name, const Toolchain& tools) {
  std::string input_path = tools.cache_dir + "/preprocess-XXXXXX";
  const int fd = mkstemp(input_path.data());
  if (fd < 0) throw gpu::GpuError("[cpu] cannot create a file in " + tools.cache_dir);
  const std::string text = "#line 1 \"" + source_name + "\"\n" + source;
  const bool written = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  if (!written) {
    std::remove(input_path.c_str());
    throw gpu::GpuError("[cpu] cannot write " + input_path);
  }
  const std::string output_path = input_path + ".i";
  auto [status, diagnostics] = run_command(shell_quote(tools.cxx) + " " + kMslPreprocessFlags + " -I" +
                                           shell_quote(tools.standin_dir) + " -o " + shell_quote(output_path) + " " +
                                           shell_quote(input_path));
  std::string output = status == 0 ? read_file(output_path) : "";
  std::remove(input_path.c_str());
  std::remove(output_path.c_str());
  if (status != 0) throw gpu::CompileError("[cpu] MSL preprocessing failed", diagnostics);

  // Drop the preprocessor's preamble (`# 0 "<built-in>"` ...) before our #line's marker.
  const size_t start = output.find("\n# 1 \"" + source_name + "\"\n");
  if (start != std::string::npos) output.erase(0, start + 1);
  return output;
}

}  // namespace mq::cpu
