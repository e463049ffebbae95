#include "kernels.h"

#include "shader_source.h"

namespace mq::engine {

Kernels::Kernels(gpu::Device& device) : library_(device.compile(embedded_shader_library(), "metalqwen-shaders")) {}

const std::shared_ptr<gpu::Kernel>& Kernels::get(const std::string& name) {
  auto& k = pipelines_[name];
  if (!k) k = library_->kernel(name);
  return k;
}

void Encoder::bind(const std::string& kernel, std::initializer_list<Arg> args, bool overlap) {
  if (dispatches_ > 0 && !overlap) cb_->barrier();
  cb_->set_kernel(kernels_.get(kernel));
  uint32_t index = 0;
  for (const Arg& a : args) {
    if (a.bytes) cb_->set_bytes(index, a.bytes, a.size);
    else if (a.buffer) cb_->set_buffer(index, a.buffer, a.offset);
    ++index;
  }
  ++dispatches_;
}

void Encoder::dispatch(const std::string& kernel, std::initializer_list<Arg> args, gpu::Size3 groups,
                       gpu::Size3 threads, bool overlap) {
  bind(kernel, args, overlap);
  cb_->dispatch_threadgroups(groups, threads);
}

void Encoder::dispatch_threads(const std::string& kernel, std::initializer_list<Arg> args, gpu::Size3 grid,
                               gpu::Size3 threads) {
  bind(kernel, args, false);
  cb_->dispatch_threads(grid, threads);
}

}  // namespace mq::engine
