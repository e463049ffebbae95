#include "threadgroup_runner.h"

#include <algorithm>
#include <cstring>

#include "../device.h"

namespace mq::cpu {
namespace {

constexpr size_t kFiberStackBytes = 256 << 10;
constexpr unsigned char kPoison = 0xFF;  // every float width reads 0xFF.. as NaN

// Read at every kernel callback: initial-exec, not the dynamic lookup (__tls_get_addr)
// a module loaded at run time gets by default.
__attribute__((tls_model("initial-exec"))) thread_local ThreadgroupRunner* t_active = nullptr;

bool same_site(const mq_abi::Site& a, const mq_abi::Site& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

std::string dim3(const mq_abi::Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace

ThreadgroupRunner& ThreadgroupRunner::for_this_thread() {
  thread_local std::unique_ptr<ThreadgroupRunner> runner(new ThreadgroupRunner());
  return *runner;
}

const mq_abi::RuntimeApi& ThreadgroupRunner::runtime_api() {
  static const mq_abi::RuntimeApi api = {
      [](mq_abi::CollectiveFn fn, void* data, mq_abi::Site site) {
        Thread& t = *t_active->running_;
        t.collective = fn;
        t.collective_data = data;
        t.site = site;
        t_active->yield_current(State::at_simd);
      },
      [](mq_abi::Site site) {
        t_active->running_->site = site;
        t_active->yield_current(State::at_barrier);
      },
      [](const void* key, size_t size, size_t align) { return t_active->threadgroup_alloc(key, size, align); },
      [](const char* message) { t_active->fail(message); },
      [](const char* name, mq_abi::Site site) { return t_active->note_lane_op(name, site); },
      [](const void* address, size_t size, mq_abi::AccessKind kind, const void* pc) {
        t_active->check_access(address, size, kind, pc);
      },
  };
  return api;
}

std::string ThreadgroupRunner::describe(const mq_abi::Site& site) const {
  return std::string(site.file) + ":" + std::to_string(site.line);
}

void ThreadgroupRunner::check_access(const void* address, size_t size, mq_abi::AccessKind kind, const void* pc) {
  if (checker_ && !checker_->access(address, size, kind, pc)) fail(checker_->message());
}

void ThreadgroupRunner::thread_main(void* arg) {
  auto* t = static_cast<Thread*>(arg);
  ThreadgroupRunner* r = t->runner;
  r->work_->kernel->entry(&r->group_launch_, &t->ids);
  r->yield_current(State::done);
  __builtin_unreachable();
}

// The runnable lane of the step after position `from` in its order, or none.
uint32_t ThreadgroupRunner::next_in_step(uint32_t from) const {
  for (uint32_t k = from; k < step_count_; ++k)
    if (threads_[step_order_[k]].state == State::runnable) return k;
  return kNone;
}

void ThreadgroupRunner::switch_to_step(Fiber& from, uint32_t position) {
  step_position_ = position;
  current_ = step_order_[position];
  running_ = &threads_[current_];
  if (checker_) checker_->set_thread(current_);
  Fiber::switch_to(from, running_->fiber);
}

// Runs the step's lanes in order, each switching straight to the next when it waits or ends
// (one switch per lane, not two through the scheduler); the last returns to the scheduler.
void ThreadgroupRunner::run_step() {
  const uint32_t first = next_in_step(0);
  if (first == kNone) return;
  in_fiber_ = true;
  switch_to_step(scheduler_, first);
  in_fiber_ = false;
}

void ThreadgroupRunner::yield_current(State state) {
  Thread& t = *running_;
  t.state = state;
  const uint32_t next = next_in_step(step_position_ + 1);
  if (next != kNone) return switch_to_step(t.fiber, next);
  Fiber::switch_to(t.fiber, scheduler_);
}

void ThreadgroupRunner::fail(const std::string& message) {
  // A CollectiveFn runs on the scheduler's stack: there is no fiber to park.
  if (!in_fiber_) throw gpu::GpuError("[cpu] kernel '" + std::string(work_->kernel->name) + "': " + message);
  // Lanes failing in the same step report the lowest one, whatever the schedule.
  if (error_.empty() || current_ < failed_thread_) {
    error_ = "[cpu] kernel '" + std::string(work_->kernel->name) + "' (threadgroup " + dim3(group_position_) +
             ", thread " + std::to_string(current_) + "): " + message;
    failed_thread_ = current_;
  }
  yield_current(State::failed);
  __builtin_unreachable();
}

void* ThreadgroupRunner::threadgroup_alloc(const void* key, size_t size, size_t align) {
  for (const auto& [site, offset] : arena_sites_)
    if (site == key) return arena_.data() + offset;
  const auto base = reinterpret_cast<uintptr_t>(arena_.data());
  size_t offset = ((base + arena_used_ + align - 1) & ~(uintptr_t(align) - 1)) - base;
  if (offset + size > mq_abi::kMaxThreadgroupMemory)
    fail("threadgroup memory of " + std::to_string(offset + size) + " bytes exceeds the limit of " +
         std::to_string(mq_abi::kMaxThreadgroupMemory) + " bytes");
  arena_used_ = offset + size;
  arena_sites_.push_back({key, offset});
  if (checker_) checker_->name_threadgroup_memory(static_cast<const char*>(key), offset, size);
  return arena_.data() + offset;
}

std::string ThreadgroupRunner::simdgroup_name(uint32_t simdgroup) const {
  return "kernel '" + std::string(work_->kernel->name) + "' (threadgroup " + dim3(group_position_) + ", SIMD-group " +
         std::to_string(simdgroup) + ")";
}

uint32_t ThreadgroupRunner::note_lane_op(const char* name, const mq_abi::Site& site) {
  Thread& t = *running_;
  if (t.lane_ops++ == 0) {
    t.first_lane_op = name;
    t.first_lane_op_site = site;
  }
  t.last_lane_op_site = site;
  t.lane_op_trace = (t.lane_op_trace ^ (reinterpret_cast<uintptr_t>(name) + site.line)) * 0x100000001B3ull;
  return t.ids.thread_index_in_simdgroup;
}

// Lanes run simdgroup_load/store on their own, but a GPU runs them for the whole
// SIMD-group: once the lanes wait, all 32 must have run the same ones.
void ThreadgroupRunner::check_lane_ops(uint32_t first, uint32_t end, uint32_t simdgroup) {
  const Thread* ran = nullptr;
  for (uint32_t i = first; i < end && !ran; ++i)
    if (threads_[i].lane_ops) ran = &threads_[i];
  if (!ran) return;
  const auto inactive = [&](uint32_t lane) {
    return gpu::GpuError("[cpu] " + simdgroup_name(simdgroup) + ": " + ran->first_lane_op + ": lane " +
                         std::to_string(lane) +
                         " is inactive (exited or beyond the grid); SIMD-group matrix functions need all 32 lanes "
                         "of the SIMD-group (" +
                         describe(ran->first_lane_op_site) + ")");
  };
  if (end - first < mq_abi::kSimdWidth) throw inactive(end - first);
  for (uint32_t i = first; i < end; ++i) {
    const Thread& t = threads_[i];
    if (t.lane_ops == 0) throw inactive(i - first);
    if (t.lane_ops != ran->lane_ops || t.lane_op_trace != ran->lane_op_trace) {
      const bool first_differs = !same_site(t.first_lane_op_site, ran->first_lane_op_site);
      throw gpu::GpuError("[cpu] " + simdgroup_name(simdgroup) + ": lanes diverged at SIMD-group functions: lane " +
                          std::to_string(ran->ids.thread_index_in_simdgroup) + " at " +
                          describe(first_differs ? ran->first_lane_op_site : ran->last_lane_op_site) + ", lane " +
                          std::to_string(t.ids.thread_index_in_simdgroup) + " at " +
                          describe(first_differs ? t.first_lane_op_site : t.last_lane_op_site));
    }
  }
  for (uint32_t i = first; i < end; ++i) {
    threads_[i].lane_ops = 0;
    threads_[i].lane_op_trace = 0;
  }
}

bool ThreadgroupRunner::step_simdgroup(uint32_t simdgroup) {
  const uint32_t first = simdgroup * mq_abi::kSimdWidth;
  const uint32_t end = std::min(thread_count_, first + mq_abi::kSimdWidth);
  step_count_ = end - first;
  order_->permute(first, step_count_, step_order_);
  run_step();
  for (uint32_t i = first; i < end; ++i)
    if (threads_[i].state == State::failed) throw gpu::GpuError(error_);
  check_lane_ops(first, end, simdgroup);
  const Thread* collective = nullptr;
  const Thread* at_barrier = nullptr;
  for (uint32_t i = first; i < end; ++i) {
    const Thread& t = threads_[i];
    if (t.state == State::at_barrier) at_barrier = &t;
    if (t.state != State::at_simd) continue;
    if (!collective) {
      collective = &t;
    } else if (!same_site(t.site, collective->site) || t.collective != collective->collective) {
      throw gpu::GpuError("[cpu] " + simdgroup_name(simdgroup) + ": lanes diverged at SIMD-group functions: lane " +
                          std::to_string(collective->ids.thread_index_in_simdgroup) + " at " +
                          describe(collective->site) + ", lane " + std::to_string(t.ids.thread_index_in_simdgroup) +
                          " at " + describe(t.site));
    }
  }
  if (!collective) return false;
  if (at_barrier)
    throw gpu::GpuError("[cpu] " + simdgroup_name(simdgroup) + ": the SIMD-group function at " +
                        describe(collective->site) + " was reached by only part of the SIMD-group (lane " +
                        std::to_string(at_barrier->ids.thread_index_in_simdgroup) +
                        " waits at the threadgroup_barrier at " + describe(at_barrier->site) + ")");
  void* lanes[mq_abi::kSimdWidth] = {};
  for (uint32_t i = first; i < end; ++i)
    if (threads_[i].state == State::at_simd) lanes[i - first] = threads_[i].collective_data;
  // The collective acts for the SIMD-group after every lane's earlier accesses, before any later one.
  if (checker_) {
    checker_->simd_sync(simdgroup);
    checker_->set_thread(collective->ids.thread_index_in_threadgroup);
  }
  collective->collective(lanes);
  if (checker_) checker_->simd_sync(simdgroup);
  for (uint32_t i = first; i < end; ++i)
    if (threads_[i].state == State::at_simd) threads_[i].state = State::runnable;
  return true;
}

// Every SIMD-group runs until it waits at a threadgroup barrier or has returned: one
// after another (forward, reverse), or interleaved collective by collective (random).
void ThreadgroupRunner::advance_to_barrier(uint32_t simdgroups) {
  uint32_t pending[mq_abi::kMaxThreadsPerThreadgroup / mq_abi::kSimdWidth];
  order_->permute(0, simdgroups, pending);
  for (uint32_t n = simdgroups; n > 0;) {
    const uint32_t k = order_->pick(n);
    if (step_simdgroup(pending[k])) continue;
    std::copy(pending + k + 1, pending + n, pending + k);
    --n;
  }
}

void ThreadgroupRunner::release_barrier() {
  const Thread* first = nullptr;
  for (uint32_t i = 0; i < thread_count_; ++i) {
    Thread& t = threads_[i];
    if (t.state != State::at_barrier) continue;
    if (first && !same_site(first->site, t.site))
      throw gpu::GpuError("[cpu] kernel '" + std::string(work_->kernel->name) + "' (threadgroup " +
                          dim3(group_position_) + "): threads wait at different threadgroup_barriers: " +
                          describe(first->site) + " (thread " + std::to_string(first->ids.thread_index_in_threadgroup) +
                          ") and " + describe(t.site) + " (thread " + std::to_string(i) + ")");
    first = first ? first : &t;
    t.state = State::runnable;
  }
  if (checker_) checker_->threadgroup_barrier();
}

void ThreadgroupRunner::run(const GroupLaunch& work, mq_abi::Dim3 group_position, mq_abi::Dim3 group_size) {
  const DefaultFloatingPoint ieee;  // for the fibers and the collectives run between them
  t_active = this;
  work_ = &work;
  group_position_ = group_position;
  error_.clear();
  if (arena_.empty()) arena_.assign(mq_abi::kMaxThreadgroupMemory, kPoison);
  std::memset(arena_.data(), kPoison, arena_used_);  // keep the arena poisoned at every group start
  arena_used_ = 0;
  arena_sites_.clear();
  checker_ = nullptr;
  if (work.checks) {
    if (!checker_storage_) checker_storage_ = std::make_unique<GroupChecker>();
    checker_ = checker_storage_.get();
    checker_->begin_group(*work.checks, group_position, arena_.data(), stacks_);
  }

  group_launch_ = *work.launch;
  for (uint32_t i = 0; i < mq_abi::kMaxBufferIndex; ++i) {
    size_t bytes = work.threadgroup_arg_bytes[i];
    group_launch_.threadgroup_buffers[i] = nullptr;
    if (bytes == 0) continue;
    if (arena_used_ + bytes > mq_abi::kMaxThreadgroupMemory)
      throw gpu::GpuError("[cpu] kernel '" + std::string(work.kernel->name) +
                          "': threadgroup arguments exceed the limit of " +
                          std::to_string(mq_abi::kMaxThreadgroupMemory) + " bytes");
    group_launch_.threadgroup_buffers[i] = arena_.data() + arena_used_;
    if (checker_) checker_->name_threadgroup_memory("[[threadgroup(" + std::to_string(i) + ")]]", arena_used_, bytes);
    arena_used_ += (bytes + 15) / 16 * 16;
  }

  thread_count_ = group_size.x * group_size.y * group_size.z;
  while (stacks_.size() < thread_count_) stacks_.push_back(std::make_unique<FiberStack>(kFiberStackBytes));
  const mq_abi::Dim3 tpg = work.launch->dispatch_threads_per_threadgroup;
  const uint32_t simdgroups = (thread_count_ + mq_abi::kSimdWidth - 1) / mq_abi::kSimdWidth;
  for (uint32_t i = 0; i < thread_count_; ++i) {
    Thread& t = threads_[i];
    mq_abi::Dim3 local = {i % group_size.x, (i / group_size.x) % group_size.y, i / (group_size.x * group_size.y)};
    t.ids.thread_position_in_threadgroup = local;
    t.ids.threadgroup_position_in_grid = group_position;
    t.ids.thread_position_in_grid = {group_position.x * tpg.x + local.x, group_position.y * tpg.y + local.y,
                                     group_position.z * tpg.z + local.z};
    t.ids.threads_per_threadgroup = group_size;
    t.ids.thread_index_in_threadgroup = i;
    t.ids.thread_index_in_simdgroup = i % mq_abi::kSimdWidth;
    t.ids.simdgroup_index_in_threadgroup = i / mq_abi::kSimdWidth;
    t.ids.simdgroups_per_threadgroup = simdgroups;
    t.ids.threads_per_simdgroup = mq_abi::kSimdWidth;
    t.runner = this;
    t.state = State::runnable;
    t.lane_ops = 0;
    t.lane_op_trace = 0;
    t.fiber.prepare(*stacks_[i], &ThreadgroupRunner::thread_main, &t);
  }

  const mq_abi::Dim3 groups = work.launch->threadgroups_per_grid;
  const uint64_t group_index = (uint64_t(group_position.z) * groups.y + group_position.y) * groups.x + group_position.x;
  ScheduleOrder order(*work.schedule, schedule_substream(work.schedule_stream, group_index));
  order_ = &order;
  for (;;) {
    advance_to_barrier(simdgroups);
    bool waiting = false;
    for (uint32_t i = 0; i < thread_count_ && !waiting; ++i) waiting = threads_[i].state == State::at_barrier;
    if (!waiting) break;
    // Threads that returned count as arrived, as on Apple GPUs.
    release_barrier();
  }
}

}  // namespace mq::cpu
