#include "toolchain.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../../common/embedded_files.h"
#include "../device.h"

namespace mq::cpu {
namespace {

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw gpu::GpuError("[cpu] cannot create the kernel cache folder " + path);
}

std::string cache_root() {
  if (const char* dir = std::getenv("METALQWEN_CACHE_DIR")) return std::string(dir) + "/cpu-kernels";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return std::string(xdg) + "/metalqwen/cpu-kernels";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/metalqwen/cpu-kernels";
}

struct Compiler {
  std::string command;
  std::string identity;
  std::string flags;
};

// Finds the compiler once and checks it is new enough for the compatibility header.
const Compiler& compiler() {
  static const Compiler c = [] {
    const char* env = std::getenv("METALQWEN_CXX");
    std::string cmd = env && *env ? env : "c++";
    const std::string needed = "the CPU runtime needs g++ >= 12 or clang >= 16 (set METALQWEN_CXX)";
    auto [status, version] = run_command(shell_quote(cmd) + " --version");
    if (status != 0) throw gpu::GpuError("[cpu] the C++ compiler '" + cmd + "' does not run; " + needed);
    auto [vstatus, major_text] = run_command(shell_quote(cmd) + " -dumpversion");
    int major = vstatus == 0 ? std::atoi(major_text.c_str()) : 0;
    if (version.find("clang") == std::string::npos) {
      if (major < 12)
        throw gpu::GpuError("[cpu] the C++ compiler '" + cmd + "' is version " + std::to_string(major) + "; " + needed);
      return Compiler{cmd, version, ""};
    }
    // What g++ does by default, clang must be told: round every _Float16 operation to half
    // (a cc1 option since clang 16), and assume no more than 4-byte alignment of a vector
    // pointer (kernels cast under-aligned device pointers to float4*, as Apple GPUs allow).
    const std::string gpu_like = "-Xclang -ffloat16-excess-precision=none -fmax-type-align=4";
    if (run_command("echo | " + shell_quote(cmd) + " -x c++ -fsyntax-only " + gpu_like + " -").first != 0)
      throw gpu::GpuError("[cpu] the C++ compiler '" + cmd + "' does not accept " + gpu_like +
                          " (kernels would not compute like a GPU); " + needed);
    return Compiler{cmd, version, gpu_like};
  }();
  return c;
}

// Writes the compatibility headers, and an empty stand-in for each msl/ header,
// once per content version; returns their folder.
std::string header_folder(const std::string& root) {
  std::string all = "layout 2\n";  // bump when the folder's layout changes (2: stand-ins)
  for (size_t i = 0; i < kCpuRuntimeHeaders.count; ++i)
    all += std::string(kCpuRuntimeHeaders.files[i].path) + '\0' + kCpuRuntimeHeaders.files[i].text;
  const std::string dir = root + "/include-" + hex(fnv1a(all));
  if (!file_exists(dir + "/complete")) {
    make_dirs(dir + "/standins");
    for (size_t i = 0; i < kCpuRuntimeHeaders.count; ++i) {
      const std::string rel = kCpuRuntimeHeaders.files[i].path;
      const std::string path = dir + "/" + rel;
      make_dirs(path.substr(0, path.rfind('/')));
      write_file_atomically(path, kCpuRuntimeHeaders.files[i].text);
      if (rel.rfind("msl/", 0) == 0) write_file_atomically(dir + "/standins/" + rel.substr(4), "");
    }
    write_file_atomically(dir + "/complete", "");
  }
  return dir;
}

}  // namespace

Toolchain toolchain() {
  const Compiler& cxx = compiler();
  const std::string root = cache_root();
  make_dirs(root);
  const std::string includes = header_folder(root);
  return Toolchain{cxx.command, cxx.flags, cxx.identity, root, includes, includes + "/standins"};
}

std::pair<int, std::string> run_command(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw gpu::GpuError("[cpu] cannot run: " + command);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::ofstream(tmp, std::ios::binary) << text;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw gpu::GpuError("[cpu] cannot write " + path);
}

}  // namespace mq::cpu
