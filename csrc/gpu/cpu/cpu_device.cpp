// The CPU implementation of device.h: buffers in host memory, MSL compiled by
// the system C++ compiler, command buffers executed in order on a queue thread.
// METALQWEN_CPU_FAULTS=cb:N makes the N-th command buffer committed on a device fail as a
// GPU fault would (see FaultPlan), so recovery from GPU errors is tested on any machine.
#include "cpu_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>  // sysconf

#include "access_checker.h"
#include "gpu/resident_ledger.h"
#include "division_fault.h"
#include "kernel_compiler.h"
#include "threadgroup_runner.h"
#include "worker_pool.h"

namespace mq::gpu {
namespace {

using cpu::LoadedLibrary;

// The checking mode puts an inaccessible gap at least this large (and as large as the
// buffer) after each new buffer, so an overrun lands in no other buffer and is reported.
constexpr size_t kCheckedBufferGap = size_t(64) << 20;

class CpuBuffer final : public Buffer {
 public:
  // New memory, filled with 0xFF so reads of never-written data show up as NaN.
  CpuBuffer(size_t size, bool gap_after) : size_(size) {
    void* p = gap_after ? map_with_gap(size) : nullptr;
    if (!gap_after && posix_memalign(&p, 256, size ? size : 1) == 0) keep_alive_.reset(p, &std::free);
    if (!p) throw GpuError("[cpu] out of memory for a buffer of " + std::to_string(size) + " bytes");
    std::memset(p, 0xFF, size);
    data_ = p;
  }
  CpuBuffer(void* data, size_t size, std::shared_ptr<void> keep_alive)
      : data_(data), size_(size), keep_alive_(std::move(keep_alive)) {}
  void* contents() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* map_with_gap(size_t size) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), used = (size + page - 1) / page * page;
    const size_t total = used + std::max(used, kCheckedBufferGap);
    void* p = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    keep_alive_.reset(p, [total](void* q) { munmap(q, total); });
    return used == 0 || mprotect(p, used, PROT_READ | PROT_WRITE) == 0 ? p : nullptr;
  }

  void* data_ = nullptr;
  size_t size_;
  std::shared_ptr<void> keep_alive_;  // the memory, or whatever keeps wrapped memory alive
};

// The decimal integer in 1..max held by environment variable `variable`, or `unset` when it
// is unset or empty; anything else throws "[cpu] <variable>='<text>' is not <what>".
uint64_t env_integer(const char* variable, uint64_t unset, uint64_t max, const char* what) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return unset;
  char* end = nullptr;
  const unsigned long long value = std::isdigit(static_cast<unsigned char>(*text)) ? std::strtoull(text, &end, 10) : 0;
  if (value < 1 || value > max || *end != '\0')
    throw GpuError(std::string("[cpu] ") + variable + "='" + text + "' is not " + what);
  return value;
}

// METALQWEN_CPU_MAX_THREADS=N caps every pipeline's thread limit at N, the way register
// pressure lowers maxTotalThreadsPerThreadgroup on Metal. A declared
// [[max_total_threads_per_threadgroup]] is only a maximum there (MSL spec 5.1.3), so the
// cap applies to it too.
uint32_t pipeline_thread_cap() {
  return uint32_t(env_integer("METALQWEN_CPU_MAX_THREADS", mq_abi::kMaxThreadsPerThreadgroup,
                              mq_abi::kMaxThreadsPerThreadgroup, "an integer in 1..1024"));
}

class CpuKernel final : public Kernel {
 public:
  CpuKernel(std::shared_ptr<LoadedLibrary> library, const mq_abi::KernelInfo& info, uint32_t thread_cap)
      : library_(std::move(library)),
        info_(info),
        name_(info.name),
        max_threads_(std::min({info.max_total_threads_per_threadgroup, mq_abi::kMaxThreadsPerThreadgroup,
                               thread_cap})) {}
  const std::string& name() const override { return name_; }
  uint32_t max_threads_per_threadgroup() const override { return max_threads_; }
  uint32_t thread_execution_width() const override { return mq_abi::kSimdWidth; }
  const mq_abi::KernelInfo& info() const { return info_; }

 private:
  std::shared_ptr<LoadedLibrary> library_;  // keeps the code loaded
  const mq_abi::KernelInfo& info_;
  std::string name_;
  uint32_t max_threads_;
};

class CpuLibrary final : public Library {
 public:
  CpuLibrary(std::shared_ptr<LoadedLibrary> library, uint32_t thread_cap)
      : library_(std::move(library)), thread_cap_(thread_cap) {}
  std::shared_ptr<Kernel> kernel(const std::string& name) override {
    const auto& exports = library_->exports();
    for (uint32_t i = 0; i < exports.kernel_count; ++i)
      if (name == exports.kernels[i].name)
        return std::make_shared<CpuKernel>(library_, exports.kernels[i], thread_cap_);
    throw GpuError("[cpu] library has no kernel function '" + name + "'");
  }
  std::vector<std::string> kernel_names() const override {
    const auto& exports = library_->exports();
    std::vector<std::string> names;
    for (uint32_t i = 0; i < exports.kernel_count; ++i) names.push_back(exports.kernels[i].name);
    return names;
  }

 private:
  std::shared_ptr<LoadedLibrary> library_;
  uint32_t thread_cap_;
};

// One argument-table slot as bound at encode time.
struct Binding {
  std::shared_ptr<Buffer> buffer;
  size_t offset = 0;
  std::shared_ptr<std::vector<unsigned char>> bytes;  // set_bytes copy
  bool bound() const { return buffer || bytes; }
  void* address() const {
    return buffer ? static_cast<char*>(buffer->contents()) + offset : static_cast<void*>(bytes->data());
  }
  size_t available() const { return buffer ? buffer->size() - offset : bytes->size(); }
};

struct Dispatch {
  std::shared_ptr<CpuKernel> kernel;
  mq_abi::Launch launch{};
  size_t threadgroup_arg_bytes[mq_abi::kMaxBufferIndex] = {};
  size_t buffer_bytes[mq_abi::kMaxBufferIndex] = {};  // bytes each bound argument may reach
  std::vector<Binding> keep;  // buffers referenced by `launch`
  bool barrier_before = false;
};

// `stream` seeds the schedule's decisions for this dispatch (threadgroup order, then
// SIMD-group and lane order inside each group).
void run_dispatch(const Dispatch& d, const cpu::Schedule& schedule, uint64_t stream,
                  const cpu::DispatchChecks* checks) {
  const mq_abi::Dim3 groups = d.launch.threadgroups_per_grid, tpg = d.launch.dispatch_threads_per_threadgroup,
                     grid = d.launch.threads_per_grid;
  const cpu::GroupLaunch work{&d.kernel->info(), &d.launch, d.threadgroup_arg_bytes, &schedule, stream, checks};
  const size_t count = size_t(groups.x) * groups.y * groups.z;
  cpu::install_division_fault_handler();
  std::vector<uint32_t> group_order(count);
  cpu::ScheduleOrder(schedule, stream).permute(0, uint32_t(count), group_order.data());
  auto run_group = [&](size_t i) {
    const size_t g = group_order[i];
    const cpu::KernelDivisionScope in_kernel;
    mq_abi::Dim3 pos = {uint32_t(g % groups.x), uint32_t(g / groups.x % groups.y), uint32_t(g / groups.x / groups.y)};
    // Edge groups of a dispatch_threads grid hold only the threads inside the grid.
    mq_abi::Dim3 size = {std::min(tpg.x, grid.x - pos.x * tpg.x), std::min(tpg.y, grid.y - pos.y * tpg.y),
                         std::min(tpg.z, grid.z - pos.z * tpg.z)};
    cpu::ThreadgroupRunner::for_this_thread().run(work, pos, size);
  };
  // The checker's device shadow is not shared between OS threads: checked groups run one by one.
  if (checks) {
    for (size_t g = 0; g < count; ++g) run_group(g);
  } else {
    cpu::WorkerPool::instance().run(count, run_group);
  }
}

// METALQWEN_CPU_FAULTS=cb:N (N >= 1): the N-th command buffer committed on the device runs
// the first half of its dispatches, then fails at its wait with a GpuError; every buffer
// committed after it, until a wait has thrown that error (the failure is observed), is not
// run and fails too, as Metal fails ("Ignored") the buffers queued behind a failed one.
// Buffers committed after that run normally. One fault per device; 0: none.
uint64_t fault_from_environment() {
  const char* variable = "METALQWEN_CPU_FAULTS";
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return 0;
  const std::string value(text), prefix = "cb:";
  char* end = nullptr;
  const bool digits = value.size() > prefix.size() && value.compare(0, prefix.size(), prefix) == 0 &&
                      std::isdigit(static_cast<unsigned char>(value[prefix.size()]));
  const unsigned long long n = digits ? std::strtoull(value.c_str() + prefix.size(), &end, 10) : 0;
  if (n < 1 || *end != '\0')
    throw GpuError(std::string("[cpu] ") + variable + "='" + value +
                   "' is not cb:N (N >= 1: the N-th command buffer committed on the device fails)");
  return n;
}

// Runs committed command buffers one after another, like a Metal command queue.
class CommandQueue {
 public:
  struct Completion {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
    bool injected = false;  // the error is METALQWEN_CPU_FAULTS': a wait that throws it observes the fault
    double seconds = 0;     // wall time of the execution
  };

  CommandQueue(cpu::Schedule schedule, cpu::CheckSet checks, uint64_t fault_at)
      : schedule_(schedule), checks_(checks), fault_at_(fault_at), thread_([this] { loop(); }) {}
  ~CommandQueue() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // `label` names the buffer in the errors of an injected fault.
  void submit(std::vector<Dispatch> work, std::shared_ptr<Completion> completion, const std::string& label) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Item item{std::move(work), std::move(completion), Fate::run, ""};
      const uint64_t number = ++committed_;
      const std::string name = "[cpu] command buffer " + std::to_string(number) +
                               (label.empty() ? "" : " ('" + label + "')");
      if (fault_at_ > 0 && !fault_observed_ && number == fault_at_) {
        item.fate = Fate::fault;
        item.message = name + " failed: fault injected by METALQWEN_CPU_FAULTS=cb:" + std::to_string(fault_at_) +
                       " after " + std::to_string(item.work.size() / 2) + " of its " +
                       std::to_string(item.work.size()) + " dispatches ran";
      } else if (fault_at_ > 0 && !fault_observed_ && number > fault_at_) {
        item.fate = Fate::ignored;
        item.message = name + " was not run: command buffer " + std::to_string(fault_at_) +
                       " before it failed (as Metal ignores the buffers queued behind a failed one)";
      }
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
  }
  // A wait threw an injected fault's error: buffers committed from now on run.
  void observe_fault() {
    std::lock_guard<std::mutex> lock(mutex_);
    fault_observed_ = true;
  }

 private:
  enum class Fate { run, fault, ignored };  // see fault_from_environment
  struct Item {
    std::vector<Dispatch> work;
    std::shared_ptr<Completion> completion;
    Fate fate = Fate::run;
    std::string message;  // the error of a fault or an ignored buffer
  };

  // Dispatches between two barriers run last-first: a legal GPU order that
  // exposes a missing barrier, which plain in-order execution would hide.
  // The checking mode keeps one device-memory shadow per barrier-free run.
  void execute(const std::vector<Dispatch>& work) {
    for (size_t begin = 0; begin < work.size();) {
      size_t end = begin + 1;
      while (end < work.size() && !work[end].barrier_before) ++end;
      std::optional<cpu::RunChecker> run;
      std::vector<const cpu::DispatchChecks*> checks(end - begin, nullptr);
      if (checks_.any()) {
        run.emplace(checks_);
        for (size_t i = begin; i < end; ++i)
          checks[i - begin] = &run->add_dispatch(work[i].kernel->info(), work[i].launch, work[i].buffer_bytes);
        run->find_read_only_memory();
      }
      for (size_t i = end; i-- > begin;)
        run_dispatch(work[i], schedule_, cpu::schedule_substream(schedule_.seed, dispatches_run_++), checks[i - begin]);
      begin = end;
    }
  }

  void loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      const auto start = std::chrono::steady_clock::now();
      if (item.fate == Fate::fault) item.work.resize(item.work.size() / 2);  // a fault part-way through
      try {
        if (item.fate != Fate::ignored) execute(item.work);
      } catch (...) {
        error = std::current_exception();
      }
      if (item.fate != Fate::run) error = std::make_exception_ptr(GpuError(item.message));
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      item.work.clear();
      std::lock_guard<std::mutex> lock(item.completion->mutex);
      item.completion->error = error;
      item.completion->injected = item.fate != Fate::run;
      item.completion->seconds = took.count();
      item.completion->done = true;
      item.completion->done_cv.notify_all();
    }
  }

  const cpu::Schedule schedule_;
  const cpu::CheckSet checks_;
  const uint64_t fault_at_;  // METALQWEN_CPU_FAULTS' N, 0 for none
  uint64_t dispatches_run_ = 0;  // numbers the dispatches: each gets its own random stream
  std::mutex mutex_;
  uint64_t committed_ = 0;        // buffers submitted so far (numbered from 1)
  bool fault_observed_ = false;  // a wait has thrown the injected fault's error
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

mq_abi::Dim3 to_dim3(Size3 s) { return {s.x, s.y, s.z}; }

class CpuCommandBuffer final : public CommandBuffer {
 public:
  explicit CpuCommandBuffer(std::shared_ptr<CommandQueue> queue) : queue_(std::move(queue)) {}

  void set_label(const std::string& label) override {
    check_open();
    label_ = label;
  }

  void set_kernel(const std::shared_ptr<Kernel>& kernel) override {
    check_open();
    kernel_ = std::dynamic_pointer_cast<CpuKernel>(kernel);
    if (!kernel_) throw GpuError("[cpu] kernel belongs to another device");
  }
  void set_buffer(uint32_t index, const std::shared_ptr<Buffer>& buffer, size_t offset) override {
    check_index(index);
    if (!buffer) throw GpuError("[cpu] set_buffer: null buffer at index " + std::to_string(index) + for_kernel());
    if (offset > buffer->size())
      throw GpuError("[cpu] set_buffer: offset " + std::to_string(offset) + " is past the end of a " +
                     std::to_string(buffer->size()) + "-byte buffer (index " + std::to_string(index) + ")" +
                     for_kernel());
    bindings_[index] = Binding{buffer, offset, nullptr};
  }
  void set_bytes(uint32_t index, const void* data, size_t size) override {
    check_index(index);
    if (size > mq_abi::kMaxSetBytes)
      throw GpuError("[cpu] set_bytes: " + std::to_string(size) + " bytes at index " + std::to_string(index) +
                     " exceed the limit of " + std::to_string(mq_abi::kMaxSetBytes) + "; use a buffer" + for_kernel());
    auto copy = std::make_shared<std::vector<unsigned char>>(size + 16);  // slack: never a zero-size vector
    std::memcpy(copy->data(), data, size);
    copy->resize(size);
    bindings_[index] = Binding{nullptr, 0, std::move(copy)};
  }
  void set_threadgroup_memory(uint32_t index, size_t size) override {
    check_index(index);
    if (size % 16 != 0) throw GpuError("[cpu] threadgroup memory length must be a multiple of 16 bytes");
    threadgroup_bytes_[index] = size;
  }
  void dispatch_threadgroups(Size3 groups, Size3 threads) override {
    Size3 grid{groups.x * threads.x, groups.y * threads.y, groups.z * threads.z};
    encode(groups, threads, grid);
  }
  void dispatch_threads(Size3 grid, Size3 threads) override {
    Size3 groups{(grid.x + threads.x - 1) / std::max(threads.x, 1u), (grid.y + threads.y - 1) / std::max(threads.y, 1u),
                 (grid.z + threads.z - 1) / std::max(threads.z, 1u)};
    encode(groups, threads, grid);
  }
  void barrier() override {
    check_open();
    pending_barrier_ = true;
  }
  void commit() override {
    check_open();
    committed_ = true;
    completion_ = std::make_shared<CommandQueue::Completion>();
    queue_->submit(std::move(work_), completion_, label_);
  }
  void wait() override {
    if (!completion_) throw GpuError("[cpu] wait() on a command buffer that was not committed");
    std::unique_lock<std::mutex> lock(completion_->mutex);
    completion_->done_cv.wait(lock, [this] { return completion_->done; });
    if (!completion_->error) return;
    if (completion_->injected) queue_->observe_fault();
    std::rethrow_exception(completion_->error);
  }
  double gpu_seconds() const override {
    if (!completion_) throw GpuError("[cpu] gpu_seconds() on a command buffer that was not committed");
    std::lock_guard<std::mutex> lock(completion_->mutex);
    return completion_->seconds;
  }

 private:
  // Names the kernel being encoded in argument errors, when one is set.
  std::string for_kernel() const { return kernel_ ? " (kernel '" + kernel_->name() + "')" : ""; }
  void check_open() const {
    if (committed_) throw GpuError("[cpu] the command buffer was already committed");
  }
  void check_index(uint32_t index) const {
    check_open();
    if (index >= mq_abi::kMaxBufferIndex)
      throw GpuError("[cpu] argument index " + std::to_string(index) + " is out of range (0..30)");
  }

  // Validates like Metal's validation layer would, then records the dispatch.
  void encode(Size3 groups, Size3 threads, Size3 grid) {
    check_open();
    if (!kernel_) throw GpuError("[cpu] dispatch without a kernel (call set_kernel first)");
    const mq_abi::KernelInfo& info = kernel_->info();
    const std::string who = "[cpu] kernel '" + kernel_->name() + "': ";
    if (threads.count() == 0 || grid.count() == 0) throw GpuError(who + "empty dispatch");
    if (threads.count() > kernel_->max_threads_per_threadgroup())
      throw GpuError(who + std::to_string(threads.count()) + " threads per threadgroup exceed its maximum of " +
                     std::to_string(kernel_->max_threads_per_threadgroup()));
    Dispatch d;
    d.kernel = kernel_;
    d.barrier_before = pending_barrier_;
    pending_barrier_ = false;
    for (uint32_t p = 0; p < info.param_count; ++p) {
      const mq_abi::ParamInfo& param = info.params[p];
      const std::string arg = "argument '" + std::string(param.name) + "' [[";
      if (param.kind == mq_abi::ParamKind::threadgroup_pointer) {
        if (!threadgroup_bytes_[param.index])
          throw GpuError(who + arg + "threadgroup(" + std::to_string(param.index) +
                         ")]] has no threadgroup memory set");
        d.threadgroup_arg_bytes[param.index] = threadgroup_bytes_[param.index];
        continue;
      }
      const Binding& b = bindings_[param.index];
      const std::string slot = arg + "buffer(" + std::to_string(param.index) + ")]]";
      if (!b.bound()) throw GpuError(who + slot + " is not bound");
      if (b.available() < param.bytes)
        throw GpuError(who + slot + " needs " + std::to_string(param.bytes) + " bytes, " +
                       std::to_string(b.available()) + " are bound");
      d.launch.buffers[param.index] = b.address();
      d.buffer_bytes[param.index] = b.available();
      d.keep.push_back(b);
    }
    d.launch.threadgroups_per_grid = to_dim3(groups);
    d.launch.threads_per_grid = to_dim3(grid);
    d.launch.dispatch_threads_per_threadgroup = to_dim3(threads);
    work_.push_back(std::move(d));
  }

  std::shared_ptr<CommandQueue> queue_;
  std::string label_;
  std::shared_ptr<CpuKernel> kernel_;
  Binding bindings_[mq_abi::kMaxBufferIndex];
  size_t threadgroup_bytes_[mq_abi::kMaxBufferIndex] = {};
  std::vector<Dispatch> work_;
  bool pending_barrier_ = false;
  bool committed_ = false;
  std::shared_ptr<CommandQueue::Completion> completion_;
};

// A memory limit: the machine's RAM unless the environment variable lowers it (tests
// simulate a small Mac with METALQWEN_CPU_MAX_BUFFER_BYTES / METALQWEN_CPU_WORKING_SET_BYTES).
uint64_t memory_limit(const char* variable) {
  const uint64_t ram = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  return std::min(env_integer(variable, ram, UINT64_MAX, "a positive number of bytes"), ram);
}

class CpuDevice final : public Device {
 public:
  CpuDevice(cpu::Schedule schedule, cpu::CheckSet checks)
      : checks_(checks),
        queue_(std::make_shared<CommandQueue>(schedule, checks, fault_from_environment())),
        max_buffer_length_(size_t(memory_limit("METALQWEN_CPU_MAX_BUFFER_BYTES"))),
        working_set_(memory_limit("METALQWEN_CPU_WORKING_SET_BYTES")),
        thread_cap_(pipeline_thread_cap()) {}
  std::string kind() const override { return "cpu"; }
  std::string name() const override { return "metalqwen CPU runtime"; }
  size_t max_buffer_length() const override { return max_buffer_length_; }
  uint64_t recommended_working_set() const override { return working_set_; }
  uint32_t gpu_cores() const override { return 10; }  // a base M-series chip's
  // Host memory is device memory here: access hints and residency change nothing (resident()
  // counts what the engine declared, for tests).
  std::shared_ptr<Buffer> new_buffer(size_t size, Access) override {
    check_buffer_length("cpu", name(), size, max_buffer_length_);
    return std::make_shared<CpuBuffer>(size, checks_.bounds);
  }
  std::shared_ptr<Buffer> wrap_host_memory(void* data, size_t size, std::shared_ptr<void> keep_alive, Access) override {
    check_buffer_length("cpu", name(), size, max_buffer_length_);
    return std::make_shared<CpuBuffer>(data, size, std::move(keep_alive));
  }
  void make_resident(const std::vector<std::shared_ptr<Buffer>>& buffers) override { resident_.add(buffers); }
  Residency resident() const override { return resident_.count(); }
  std::shared_ptr<Library> compile(const std::string& source, const std::string& name) override {
    return std::make_shared<CpuLibrary>(cpu::build_library(source, name, checks_.any()), thread_cap_);
  }
  std::string compile_notice(const std::string& source, const std::string& name) const override {
    return cpu::library_build_notice(source, name, checks_.any());
  }
  std::unique_ptr<CommandBuffer> new_command_buffer() override { return std::make_unique<CpuCommandBuffer>(queue_); }

 private:
  const cpu::CheckSet checks_;
  std::shared_ptr<CommandQueue> queue_;
  size_t max_buffer_length_;
  uint64_t working_set_;
  uint32_t thread_cap_;
  ResidentLedger resident_;
};

}  // namespace

std::shared_ptr<Device> open_cpu_device(const std::string& schedule, const std::vector<std::string>& checks) {
  return std::make_shared<CpuDevice>(schedule.empty() ? cpu::Schedule::from_environment()
                                                      : cpu::Schedule::parse(schedule),
                                     cpu::parse_checks(checks));
}

}  // namespace mq::gpu
