// The shader library on one device, and a compact way to encode dispatches of it.
#pragma once
#include <initializer_list>
#include <map>
#include <memory>
#include <string>

#include "gpu/device.h"

namespace mq::engine {

class Kernels {
 public:
  explicit Kernels(gpu::Device& device);
  // Throws gpu::GpuError naming a kernel the library lacks.
  const std::shared_ptr<gpu::Kernel>& get(const std::string& name);

 private:
  std::shared_ptr<gpu::Library> library_;
  std::map<std::string, std::shared_ptr<gpu::Kernel>> pipelines_;
};

// One argument of a dispatch: a buffer at a byte offset, or small bytes (setBytes).
struct Arg {
  std::shared_ptr<gpu::Buffer> buffer;
  size_t offset = 0;
  const void* bytes = nullptr;
  size_t size = 0;
  Arg(std::shared_ptr<gpu::Buffer> b, size_t off = 0) : buffer(std::move(b)), offset(off) {}
  template <class T>
  static Arg value(const T& v) {
    Arg a(nullptr);
    a.bytes = &v;
    a.size = sizeof(T);
    return a;
  }
};

// Records dispatches into one command buffer, counting them; every dispatch is
// separated from the previous one by a barrier unless `overlap` is asked for.
class Encoder {
 public:
  Encoder(gpu::Device& device, Kernels& kernels) : kernels_(kernels), cb_(device.new_command_buffer()) {}
  void dispatch(const std::string& kernel, std::initializer_list<Arg> args, gpu::Size3 groups, gpu::Size3 threads,
                bool overlap = false);
  // A grid of threads (edge threadgroups partial).
  void dispatch_threads(const std::string& kernel, std::initializer_list<Arg> args, gpu::Size3 grid,
                        gpu::Size3 threads);
  std::unique_ptr<gpu::CommandBuffer> finish() { return std::move(cb_); }
  uint32_t dispatches() const { return dispatches_; }

 private:
  void bind(const std::string& kernel, std::initializer_list<Arg> args, bool overlap);

  Kernels& kernels_;
  std::unique_ptr<gpu::CommandBuffer> cb_;
  uint32_t dispatches_ = 0;
};

}  // namespace mq::engine
