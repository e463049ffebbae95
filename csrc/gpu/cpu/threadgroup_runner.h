// Runs the threads of one threadgroup as fibers on the calling OS thread, with
// GPU synchronisation semantics: threadgroup barriers, SIMD-group collectives,
// shared threadgroup memory (NaN-filled before each group).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "abi.h"
#include "access_checker.h"
#include "fiber.h"
#include "schedule.h"

namespace mq::cpu {

struct GroupLaunch {
  const mq_abi::KernelInfo* kernel;
  const mq_abi::Launch* launch;
  const size_t* threadgroup_arg_bytes;  // [kMaxBufferIndex]: [[threadgroup(n)]] sizes, 0 = unbound
  const Schedule* schedule;  // order of SIMD-groups and lanes
  uint64_t schedule_stream;  // the dispatch's stream (see ScheduleOrder)
  const DispatchChecks* checks = nullptr;  // the checking mode's view of the dispatch, or none
};

class ThreadgroupRunner {
 public:
  // The runner of the calling OS thread (each worker keeps its fibers and stacks).
  static ThreadgroupRunner& for_this_thread();
  // The services compiled kernels call (bound into every loaded library).
  static const mq_abi::RuntimeApi& runtime_api();

  // Runs every thread of the group to completion; throws GpuError on a kernel fault.
  void run(const GroupLaunch& work, mq_abi::Dim3 group_position, mq_abi::Dim3 group_size);

 private:
  enum class State { runnable, at_simd, at_barrier, done, failed };
  struct Thread {
    Fiber fiber;
    State state = State::done;
    mq_abi::ThreadIds ids{};
    mq_abi::CollectiveFn collective = nullptr;
    void* collective_data = nullptr;
    mq_abi::Site site{};
    ThreadgroupRunner* runner = nullptr;
    // SIMD-group functions run without waiting (simd_lane_op) since the SIMD-group last waited.
    uint32_t lane_ops = 0;
    uint64_t lane_op_trace = 0;  // hash of their names and lines
    const char* first_lane_op = nullptr;
    mq_abi::Site first_lane_op_site{}, last_lane_op_site{};
  };

  static constexpr uint32_t kNone = ~0u;
  static void thread_main(void* thread);
  uint32_t next_in_step(uint32_t from) const;
  void switch_to_step(Fiber& from, uint32_t position);
  void run_step();
  void yield_current(State state);
  void advance_to_barrier(uint32_t simdgroups);
  bool step_simdgroup(uint32_t simdgroup);
  void check_lane_ops(uint32_t first, uint32_t end, uint32_t simdgroup);
  uint32_t note_lane_op(const char* name, const mq_abi::Site& site);
  std::string simdgroup_name(uint32_t simdgroup) const;
  void release_barrier();
  void* threadgroup_alloc(const void* key, size_t size, size_t align);
  [[noreturn]] void fail(const std::string& message);
  std::string describe(const mq_abi::Site& site) const;
  void check_access(const void* address, size_t size, mq_abi::AccessKind kind, const void* pc);

  Fiber scheduler_;
  // Every thread a group may have, in one array: the runner scans a SIMD-group's states often.
  std::unique_ptr<Thread[]> threads_{new Thread[mq_abi::kMaxThreadsPerThreadgroup]};
  std::vector<std::unique_ptr<FiberStack>> stacks_;
  uint32_t thread_count_ = 0;
  uint32_t current_ = 0;
  Thread* running_ = nullptr;  // &threads_[current_]
  // The SIMD-group step running: its lanes in schedule order, and the position of current_.
  uint32_t step_order_[mq_abi::kSimdWidth] = {};
  uint32_t step_count_ = 0, step_position_ = 0;
  bool in_fiber_ = false;  // a kernel thread is running (not the scheduler)
  const GroupLaunch* work_ = nullptr;
  mq_abi::Launch group_launch_{};  // the dispatch's launch plus this group's threadgroup arguments
  mq_abi::Dim3 group_position_{};
  ScheduleOrder* order_ = nullptr;  // this group's schedule decisions
  std::string error_;
  uint32_t failed_thread_ = 0;  // whose message error_ holds
  GroupChecker* checker_ = nullptr;  // the checking mode, when the dispatch asks for it
  std::unique_ptr<GroupChecker> checker_storage_;

  // Threadgroup memory: one arena per runner, offsets assigned per declaration site.
  std::vector<unsigned char> arena_;
  std::vector<std::pair<const void*, size_t>> arena_sites_;
  size_t arena_used_ = 0;
};

}  // namespace mq::cpu
