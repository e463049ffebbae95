// The shader library on one device, and a compact way to encode dispatches of it.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.h"

namespace mq::engine {

// How many threads a kernel's threadgroup may hold: `preferred` where its pipeline
// allows, else the largest multiple of MQ_SIMD_WIDTH within the pipeline's limit, but
// never fewer than `minimum` (minimum == preferred: exactly that many).
struct ThreadgroupNeed {
  uint32_t preferred = 0;
  uint32_t minimum = 0;
};

// A kernel's pipeline and the threadgroup size chosen for it at load.
struct Pipeline {
  std::string name;
  std::shared_ptr<gpu::Kernel> kernel;
  uint32_t threads = 0;
};

// A dispatch as an Encoder encoded it, argument bytes copied: enough to encode it again
// on its own (bench/ times each kernel of a step so).
struct RecordedDispatch {
  struct Argument {
    std::shared_ptr<gpu::Buffer> buffer;
    size_t offset = 0;
    std::vector<uint8_t> bytes;  // setBytes arguments
  };
  std::string kernel;
  std::vector<Argument> args;  // by buffer index
  gpu::Size3 grid, threads;    // grid: threadgroups, or threads when `grid_of_threads`
  bool grid_of_threads = false;
  bool overlap = false;        // encoded without a barrier before it
};

class Kernels {
 public:
  // `progress(done, total, note)` as pipelines are built; `note` says what the build
  // spends its time on when that is slow (e.g. a first-run compile), else it is empty.
  using Progress = std::function<void(uint64_t done, uint64_t total, const std::string& note)>;

  // Compiles the library of exactly the kernels in `needs` (their families' headers and their
  // instances, shader_source.h), then creates their pipelines (concurrently on Metal) and
  // chooses each one's threadgroup size within the pipeline's limit (Metal lowers it for
  // kernels with many registers). Throws gpu::GpuError naming every kernel whose limit is
  // below its minimum. `progress` hears of the compile first (its note says what it
  // compiles), then of each pipeline as it is built.
  void create(gpu::Device& device, const std::map<std::string, ThreadgroupNeed>& needs, const Progress& progress = {});
  // Throws gpu::GpuError for a kernel that create() was not given. The reference stays valid
  // for the life of these kernels: the engine resolves its pipelines once, at load.
  const Pipeline& get(const std::string& name) const;
  size_t size() const { return pipelines_.size(); }
  // The compiled library: its kernel functions (the pipelines' plus the plain kernels their
  // headers define) and the MSL bytes it was compiled from.
  size_t library_kernels() const { return library_kernels_; }
  size_t library_source_bytes() const { return library_source_bytes_; }
  // While set, every Encoder over these kernels appends its dispatches here (nullptr: off).
  void record_into(std::vector<RecordedDispatch>* sink) { recorded_ = sink; }
  std::vector<RecordedDispatch>* recording() const { return recorded_; }

 private:
  std::shared_ptr<gpu::Library> library_;
  size_t library_kernels_ = 0, library_source_bytes_ = 0;
  std::map<std::string, Pipeline> pipelines_;
  std::vector<RecordedDispatch>* recorded_ = nullptr;
};

// Each pipeline a model's steps use, with its threadgroup need and the slot the engine keeps
// it in (Engine::plan_kernels): Kernels::create builds them, resolve() fills every slot, so a
// step dispatches through pointers and never looks a kernel up by name.
class KernelPlan {
 public:
  void need(const Pipeline*& slot, const std::string& name, ThreadgroupNeed need) {
    needs_[name] = need;
    slots_.emplace_back(&slot, name);
  }
  const std::map<std::string, ThreadgroupNeed>& needs() const { return needs_; }
  void resolve(const Kernels& kernels) const {
    for (const auto& [slot, name] : slots_) *slot = &kernels.get(name);
  }

 private:
  std::map<std::string, ThreadgroupNeed> needs_;
  std::vector<std::pair<const Pipeline**, std::string>> slots_;
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

// Records the dispatches of one step into command buffers, counting them; every dispatch is
// separated from the previous one by a barrier unless `overlap` is asked for. A step is one
// command buffer unless split(): the device runs its buffers in commit order.
class Encoder {
 public:
  using Clock = std::chrono::steady_clock;
  // `label` names the step's buffers in GPU errors (e.g. "decode step").
  Encoder(gpu::Device& device, Kernels& kernels, std::string label);
  // Names the part of the step the current buffer holds: "<label> (<part>)".
  void name_part(const std::string& part) { cb_->set_label(label_ + " (" + part + ")"); }
  // Commits the current buffer and goes on in a new one; the state stays in device memory.
  void split();
  // Commits the last buffer; returns every buffer of the step in commit order.
  std::vector<std::unique_ptr<gpu::CommandBuffer>> finish();
  void dispatch(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 groups, gpu::Size3 threads,
                bool overlap = false);
  // Threadgroups of the size chosen for `kernel` at load.
  void dispatch(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 groups) {
    dispatch(kernel, args, groups, {kernel.threads});
  }
  // A grid of threads (edge threadgroups partial) in threadgroups of the chosen size.
  void dispatch_threads(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 grid, bool overlap = false);
  uint32_t dispatches() const { return dispatches_; }
  // Dependent dispatch boundaries: dispatches after the first one that were not overlapped.
  uint32_t barriers() const { return barriers_; }
  // Host time spent encoding: from the encoder's creation to its last dispatch (so a wait for
  // an earlier step before the commit is not counted).
  std::chrono::duration<double, std::micro> encoding_time() const { return last_dispatch_ - started_; }

 private:
  void bind(const Pipeline& kernel, std::initializer_list<Arg> args, bool overlap);
  // Notes the time and, while Kernels records, appends the dispatch there.
  void after_dispatch(const Pipeline& kernel, std::initializer_list<Arg> args, gpu::Size3 grid, gpu::Size3 threads,
                      bool grid_of_threads, bool overlap);

  gpu::Device& device_;
  Kernels& kernels_;
  std::string label_;
  std::unique_ptr<gpu::CommandBuffer> cb_;                    // being encoded
  std::vector<std::unique_ptr<gpu::CommandBuffer>> committed_;  // split off before it
  uint32_t dispatches_ = 0, barriers_ = 0;
  Clock::time_point started_, last_dispatch_ = started_;
};

}  // namespace mq::engine
