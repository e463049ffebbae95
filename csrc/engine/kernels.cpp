#include "kernels.h"

#include <algorithm>
#include <set>

#include "../../shaders/params.h"
#include "shader_source.h"

namespace mq::engine {

void Kernels::create(gpu::Device& device, const std::map<std::string, ThreadgroupNeed>& needs,
                     const Progress& progress) {
  std::set<std::string> names;
  for (const auto& [name, need] : needs) names.insert(name);
  library_ = device.prebuilt_library(embedded_shader_key());
  if (library_) {  // the whole library, compiled when the package was built
    library_source_bytes_ = 0;
    if (progress)
      progress(0, needs.size(), "creating " + std::to_string(names.size()) + " pipelines from the prebuilt library");
  } else {  // only the kernels the model runs: their families' headers and their instances
    const std::string source = assemble_kernel_library(embedded_shader_files(), names);
    const char* name_of_source = "metalqwen-shaders";
    library_source_bytes_ = source.size();
    if (progress) {
      const std::string notice = device.compile_notice(source, name_of_source);
      progress(0, needs.size(),
               notice.empty() ? ""
                              : notice + ": " + std::to_string(names.size()) + " kernels, " +
                                    std::to_string(source.size() / 1024) + " KB of MSL");
    }
    library_ = device.compile(source, name_of_source);
  }
  library_kernels_ = library_->kernel_names().size();
  const std::vector<std::string> ordered(names.begin(), names.end());
  const auto kernels = library_->kernels(ordered, [&](size_t built) {
    if (progress) progress(built, needs.size(), "");
  });
  std::string unfit;
  for (size_t i = 0; i < ordered.size(); ++i) {
    const std::string& name = ordered[i];
    const ThreadgroupNeed& need = needs.at(name);
    Pipeline p{name, kernels[i], 0};
    const uint32_t limit = p.kernel->max_threads_per_threadgroup();
    p.threads = std::min(need.preferred, limit / MQ_SIMD_WIDTH * MQ_SIMD_WIDTH);
    if (p.threads < need.minimum || p.threads == 0) {
      unfit += (unfit.empty() ? "" : "; ") + std::string("kernel '") + name + "' allows at most " +
               std::to_string(limit) + " threads per threadgroup and needs " +
               (need.minimum == need.preferred ? "" : "at least ") + std::to_string(need.minimum);
    }
    pipelines_[name] = std::move(p);
  }
  if (!unfit.empty()) throw gpu::GpuError("[engine] this GPU cannot run the model's kernels: " + unfit);
}

const Pipeline& Kernels::get(const std::string& name) const {
  auto it = pipelines_.find(name);
  if (it == pipelines_.end()) throw gpu::GpuError("[engine] kernel '" + name + "' was not created at load");
  return it->second;
}

Encoder::Encoder(gpu::Device& device, Kernels& kernels, std::string label)
    : device_(device),
      kernels_(kernels),
      label_(std::move(label)),
      cb_(device.new_command_buffer()),
      started_(Clock::now()) {
  cb_->set_label(label_);
}

void Encoder::split() {
  cb_->commit();
  committed_.push_back(std::move(cb_));
  cb_ = device_.new_command_buffer();
  cb_->set_label(label_);
}

std::vector<std::unique_ptr<gpu::CommandBuffer>> Encoder::finish() {
  cb_->commit();
  committed_.push_back(std::move(cb_));
  return std::move(committed_);
}

void Encoder::bind(const Pipeline& kernel, std::initializer_list<Arg> args, bool overlap) {
  if (dispatches_ > 0 && !overlap) {
    cb_->barrier();
    ++barriers_;
  }
  cb_->set_kernel(kernel.kernel);
  uint32_t index = 0;
  for (const Arg& a : args) {
    if (a.bytes) cb_->set_bytes(index, a.bytes, a.size);
    else if (a.buffer) cb_->set_buffer(index, a.buffer, a.offset);
    ++index;
  }
  ++dispatches_;
}

void Encoder::after_dispatch(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 grid,
                             gpu::Size3 threads, bool grid_of_threads, bool overlap) {
  last_dispatch_ = Clock::now();
  std::vector<RecordedDispatch>* sink = kernels_.recording();
  if (!sink) return;
  RecordedDispatch d{kernel.name, {}, grid, threads, grid_of_threads, overlap};
  for (const Arg& a : args) {
    const auto* bytes = static_cast<const uint8_t*>(a.bytes);
    d.args.push_back({a.buffer, a.offset,
                      bytes ? std::vector<uint8_t>(bytes, bytes + a.size) : std::vector<uint8_t>{}});
  }
  sink->push_back(std::move(d));
}

void Encoder::dispatch(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 groups, gpu::Size3 threads,
                       bool overlap) {
  bind(kernel, args, overlap);
  cb_->dispatch_threadgroups(groups, threads);
  after_dispatch(kernel, args, groups, threads, false, overlap);
}

void Encoder::dispatch_threads(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 grid, bool overlap) {
  bind(kernel, args, overlap);
  cb_->dispatch_threads(grid, {kernel.threads});
  after_dispatch(kernel, args, grid, {kernel.threads}, true, overlap);
}

}  // namespace mq::engine
