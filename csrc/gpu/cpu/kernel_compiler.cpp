#include "kernel_compiler.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "../../common/embedded_files.h"
#include "../device.h"
#include "threadgroup_runner.h"

namespace mq::cpu {
namespace {

// The kernels must see GPU-like numerics: no contraction into FMA the source did
// not ask for, no fast math; MSL char is signed.
const char* kCompileFlags =
    "-std=c++20 -O2 -fPIC -shared -fsigned-char -fno-strict-aliasing -ffp-contract=off -fno-fast-math "
    "-Wno-unknown-pragmas -Wno-attributes -Wno-unused";

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command; returns its exit status and combined output.
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

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw gpu::GpuError("[cpu] cannot create the kernel cache folder " + path);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::ofstream(tmp, std::ios::binary) << text;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw gpu::GpuError("[cpu] cannot write " + path);
}

bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string cache_root() {
  if (const char* dir = std::getenv("METALQWEN_CACHE_DIR")) return std::string(dir) + "/cpu-kernels";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return std::string(xdg) + "/metalqwen/cpu-kernels";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/metalqwen/cpu-kernels";
}

struct Compiler {
  std::string command;
  std::string identity;  // its --version text, part of the cache key
};

// Finds the compiler once and checks it is new enough for the compatibility header.
const Compiler& compiler() {
  static const Compiler c = [] {
    const char* env = std::getenv("METALQWEN_CXX");
    std::string cmd = env && *env ? env : "c++";
    auto [status, version] = run_command(shell_quote(cmd) + " --version");
    if (status != 0)
      throw gpu::GpuError("[cpu] the C++ compiler '" + cmd +
                          "' does not run; install g++ >= 12 or clang >= 15, or set METALQWEN_CXX");
    auto [vstatus, major_text] = run_command(shell_quote(cmd) + " -dumpversion");
    int major = vstatus == 0 ? std::atoi(major_text.c_str()) : 0;
    bool clang = version.find("clang") != std::string::npos;
    if (major < (clang ? 15 : 12))
      throw gpu::GpuError("[cpu] the C++ compiler '" + cmd + "' is version " + std::to_string(major) +
                          "; the CPU runtime needs g++ >= 12 or clang >= 15 (set METALQWEN_CXX)");
    return Compiler{cmd, version};
  }();
  return c;
}

// Writes the compatibility headers once per content version; returns their folder.
std::string header_folder(const std::string& root) {
  std::string all;
  for (size_t i = 0; i < kCpuRuntimeHeaders.count; ++i)
    all += std::string(kCpuRuntimeHeaders.files[i].path) + '\0' + kCpuRuntimeHeaders.files[i].text;
  const std::string dir = root + "/include-" + hex(fnv1a(all));
  if (!file_exists(dir + "/complete")) {
    for (size_t i = 0; i < kCpuRuntimeHeaders.count; ++i) {
      const std::string path = dir + "/" + kCpuRuntimeHeaders.files[i].path;
      make_dirs(path.substr(0, path.rfind('/')));
      write_file_atomically(path, kCpuRuntimeHeaders.files[i].text);
    }
    write_file_atomically(dir + "/complete", "");
  }
  return dir;
}

}  // namespace

LoadedLibrary::~LoadedLibrary() { dlclose(handle_); }

std::shared_ptr<LoadedLibrary> build_library(const std::string& cpp_source) {
  static std::mutex mutex;
  static std::map<uint64_t, std::weak_ptr<LoadedLibrary>> loaded;
  std::lock_guard<std::mutex> lock(mutex);

  const Compiler& cxx = compiler();
  const std::string root = cache_root();
  make_dirs(root);
  const std::string includes = header_folder(root);
  const uint64_t key = fnv1a(cpp_source, fnv1a(cxx.identity + kCompileFlags + includes));
  if (auto lib = loaded[key].lock()) return lib;

  const std::string base = root + "/" + hex(key);
  const std::string so_path = base + ".so";
  if (!file_exists(so_path)) {
    const std::string src_path = base + ".cpp";
    write_file_atomically(src_path, cpp_source);
    const std::string tmp_so = base + ".tmp" + std::to_string(getpid()) + ".so";
    auto [status, diagnostics] =
        run_command(shell_quote(cxx.command) + " " + kCompileFlags + " -I" + shell_quote(includes + "/msl") + " -o " +
                    shell_quote(tmp_so) + " " + shell_quote(src_path));
    if (status != 0) {
      std::remove(tmp_so.c_str());
      throw gpu::CompileError("[cpu] MSL compilation failed (translated source: " + src_path + ")", diagnostics);
    }
    if (std::rename(tmp_so.c_str(), so_path.c_str()) != 0) throw gpu::GpuError("[cpu] cannot write " + so_path);
  }

  void* handle = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw gpu::GpuError(std::string("[cpu] cannot load compiled kernels: ") + dlerror());
  auto* exports = static_cast<const mq_abi::LibraryExports*>(dlsym(handle, mq_abi::kExportsSymbol));
  if (!exports || exports->abi_version != mq_abi::kAbiVersion) {
    dlclose(handle);
    throw gpu::GpuError("[cpu] " + so_path + " was built for another runtime version; delete it");
  }
  exports->bind_runtime(&ThreadgroupRunner::runtime_api());
  auto lib = std::make_shared<LoadedLibrary>(handle, exports);
  loaded[key] = lib;
  return lib;
}

}  // namespace mq::cpu
