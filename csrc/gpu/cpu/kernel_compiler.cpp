#include "kernel_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>

#include "../device.h"
#include "msl_check.h"
#include "msl_preprocess.h"
#include "msl_translate.h"
#include "threadgroup_runner.h"
#include "toolchain.h"

namespace mq::cpu {
namespace {

// The kernels must see GPU-like numerics: no contraction into FMA the source did
// not ask for, no fast math; MSL char is signed.
const char* kCompileFlags =
    "-std=c++20 -O2 -fPIC -shared -fsigned-char -fno-strict-aliasing -ffp-contract=off -fno-fast-math "
    "-Wno-unknown-pragmas -Wno-attributes -Wno-unused";
// The checking variant (access_checker.h): every load and store calls a __tsan_* hook
// (msl/mq_access_hooks.h); debug info maps the instruction back to its MSL line. It is
// compiled (-c) and linked in two steps so the driver does not link the sanitizer runtime,
// in the cache folder, which debug info then names as the folder of relative MSL file names.
const char* kCheckedFlags = "-fsanitize=thread -g -DMQ_CHECK_ACCESSES=1";

// This build of the runtime, whose translator decides what a raw source becomes: a hash
// of the loaded module, taken at load time, before a reinstall could replace the file.
std::string hash_this_module() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&hash_this_module), &info) && info.dli_fname) {
    const std::string bytes = read_file(info.dli_fname);
    if (!bytes.empty()) return hex(fnv1a(bytes));
  }
  return "unknown build, process " + std::to_string(getpid());  // then no reuse across processes
}
const std::string kRuntimeBuild = hash_this_module();

// fma() as one instruction where this CPU has it, not a call into libm: the same correctly
// rounded result, and about 4 % of the engine tests' time. (Part of the cache key.)
const char* host_flags() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("fma") ? " -mfma" : "";
#else
  return "";
#endif
}

std::string compile_flags(const Toolchain& tools, bool checked) {
  return std::string(kCompileFlags) + host_flags() + " " + tools.cxx_flags +
         (checked ? std::string(" ") + kCheckedFlags : "");
}

// An exclusive lock on the file `path` (created) while alive: processes building the same
// object (test workers on a cold cache) wait for the first, which builds it once.
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw gpu::GpuError("[cpu] cannot create the lock file " + path);
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        close(fd_);
        throw gpu::GpuError("[cpu] cannot lock " + path);
      }
    }
  }
  ~FileLock() { close(fd_); }  // releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// Compiles translated C++ into `base`.so (keeping `base`.cpp to read) unless it is there.
void compile_object(const Toolchain& tools, const std::string& cpp_source, const std::string& base, bool checked) {
  const std::string so_path = base + ".so";
  if (file_exists(so_path)) return;
  FileLock lock(base + ".lock");
  if (file_exists(so_path)) return;  // another process built it while this one waited
  const std::string src_path = base + ".cpp";
  write_file_atomically(src_path, cpp_source);
  const std::string tmp = base + ".tmp" + std::to_string(getpid()), tmp_so = tmp + ".so", tmp_o = tmp + ".o";
  const std::string compile = shell_quote(tools.cxx) + " " + compile_flags(tools, checked) + " -I" +
                              shell_quote(tools.include_dir + "/msl") + " " + shell_quote(src_path);
  auto [status, diagnostics] = checked ? run_command("cd " + shell_quote(tools.cache_dir) + " && " + compile +
                                                     " -c -o " + shell_quote(tmp_o) + " && " + shell_quote(tools.cxx) +
                                                     " -shared -o " + shell_quote(tmp_so) + " " + shell_quote(tmp_o))
                                       : run_command(compile + " -o " + shell_quote(tmp_so));
  std::remove(tmp_o.c_str());
  if (status != 0) {
    std::remove(tmp_so.c_str());
    throw gpu::CompileError("[cpu] MSL compilation failed (translated source: " + src_path + ")", diagnostics);
  }
  if (std::rename(tmp_so.c_str(), so_path.c_str()) != 0) throw gpu::GpuError("[cpu] cannot write " + so_path);
}

std::shared_ptr<LoadedLibrary> load(const std::string& so_path) {
  void* handle = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw gpu::GpuError(std::string("[cpu] cannot load compiled kernels: ") + dlerror());
  auto* exports = static_cast<const mq_abi::LibraryExports*>(dlsym(handle, mq_abi::kExportsSymbol));
  if (!exports || exports->abi_version != mq_abi::kAbiVersion) {
    dlclose(handle);
    throw gpu::GpuError("[cpu] " + so_path + " was built for another runtime version; delete it");
  }
  exports->bind_runtime(&ThreadgroupRunner::runtime_api());
  return std::make_shared<LoadedLibrary>(handle, exports);
}

uint64_t toolchain_key(const Toolchain& tools, bool checked) {
  return fnv1a(tools.identity + compile_flags(tools, checked) + tools.include_dir);
}

// What a raw source becomes also depends on its name (it is in the line markers), the
// preprocessing flags and this runtime's translator; `<key>.ref` holds the object key.
uint64_t source_key(const std::string& msl_source, const std::string& source_name, uint64_t toolchain) {
  return fnv1a(msl_source, fnv1a(source_name + '\0' + kMslPreprocessFlags + '\0' + kRuntimeBuild, toolchain));
}

// The cached object's key for a raw source, or "" when it must be (re)built.
std::string cached_object(const Toolchain& tools, uint64_t source) {
  const std::string object = read_file(tools.cache_dir + "/" + hex(source) + ".ref");
  return object.size() == 16 && file_exists(tools.cache_dir + "/" + object + ".so") ? object : "";
}

}  // namespace

LoadedLibrary::~LoadedLibrary() { dlclose(handle_); }

std::string library_build_notice(const std::string& msl_source, const std::string& source_name, bool checked) {
  const Toolchain tools = toolchain();
  const uint64_t toolchain = toolchain_key(tools, checked);
  const uint64_t source = source_key(msl_source, source_name, toolchain);
  if (!cached_object(tools, source).empty()) return "";
  // A new build of this runtime translates the source again, often to a cached object.
  const std::string cpp = translate_msl(preprocess_msl(msl_source, source_name, tools), source_name).cpp;
  const std::string object = hex(fnv1a(cpp, toolchain));
  if (file_exists(tools.cache_dir + "/" + object + ".so")) {
    write_file_atomically(tools.cache_dir + "/" + hex(source) + ".ref", object);
    return "";
  }
  return "compiling GPU kernels with " + tools.cxx + " (first run only, cached in " + tools.cache_dir + ")";
}

std::shared_ptr<LoadedLibrary> build_library(const std::string& msl_source, const std::string& source_name,
                                             bool checked) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<LoadedLibrary>> loaded;  // by object key
  std::lock_guard<std::mutex> lock(mutex);

  const Toolchain tools = toolchain();
  const uint64_t toolchain = toolchain_key(tools, checked);
  const uint64_t source = source_key(msl_source, source_name, toolchain);
  check_msl_for_compile(msl_source, source_name, tools, source);
  const std::string source_ref = tools.cache_dir + "/" + hex(source) + ".ref";
  std::string object = cached_object(tools, source);
  if (object.empty()) {
    const std::string cpp = translate_msl(preprocess_msl(msl_source, source_name, tools), source_name).cpp;
    object = hex(fnv1a(cpp, toolchain));
    compile_object(tools, cpp, tools.cache_dir + "/" + object, checked);
    write_file_atomically(source_ref, object);
  }
  if (auto lib = loaded[object].lock()) return lib;
  auto lib = load(tools.cache_dir + "/" + object + ".so");
  loaded[object] = lib;
  return lib;
}

}  // namespace mq::cpu
