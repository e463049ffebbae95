// The CPU runtime's checking mode (docs/cpu-runtime.md, "Races and bounds"): kernels compiled as the checking
// variant (msl/mq_access_hooks.h) report every load and store here; the checker keeps shadow
// state per threadgroup-memory and device-memory word and reports, independent of the order
// the runtime happens to run threads in,
//   races:  two accesses to the same bytes by different threads, at least one a write, that
//           no barrier orders: threadgroup_barrier orders a threadgroup, simdgroup_barrier and
//           SIMD-group functions order the lanes of one SIMD-group, nothing orders threadgroups
//           of a dispatch or dispatches between two command-buffer barriers;
//   bounds: device/constant accesses outside every bound buffer (size minus offset, set_bytes
//           included) and threadgroup accesses outside every declared variable.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "abi.h"
#include "fiber.h"

namespace mq::cpu {

struct CheckSet {
  bool races = false;
  bool bounds = false;
  bool any() const { return races || bounds; }
};
// From the names "races" and "bounds"; no names means METALQWEN_CPU_CHECKS (a comma list).
// Throws GpuError naming an unknown check.
CheckSet parse_checks(const std::vector<std::string>& names);

// One access as the shadow remembers it.
struct AccessRecord {
  uint64_t who = 0;            // thread_identity(); 0 = none
  const void* pc = nullptr;    // the kernel instruction
  uint32_t barrier_epoch = 0;  // threadgroup_barriers its group had passed
  uint32_t simd_epoch = 0;     // SIMD-group synchronisations its SIMD-group had passed
  uint8_t mask = 0;            // which bytes of the 4-byte word
};
// Shadow of one 4-byte word: the last write and up to two reads by distinct threads.
struct WordShadow {
  AccessRecord write;
  AccessRecord reads[2];
};

class RunChecker;

// What the checker knows about one dispatch of a run.
struct DispatchChecks {
  struct Binding {
    uintptr_t begin, end;  // the bound bytes: buffer base + offset .. buffer end
    uint32_t index;        // [[buffer(index)]]
    bool writable;         // some parameter bound here is not const
    bool shared_with_writer = true;  // a writable binding of the run overlaps it: reads need shadow
  };
  CheckSet checks;
  RunChecker* run;
  uint32_t number;  // its position in the run
  const mq_abi::KernelInfo* kernel;
  mq_abi::Dim3 groups;
  std::vector<Binding> bindings;
  uintptr_t image_base = 0;  // where the kernel's library is loaded (dladdr's dli_fbase)
};

// A barrier-free run of dispatches: the device-memory shadow its dispatches share.
class RunChecker {
 public:
  explicit RunChecker(CheckSet checks);
  ~RunChecker();
  // `buffer_bytes[i]` is how many bytes argument i has bound (0 = none).
  const DispatchChecks& add_dispatch(const mq_abi::KernelInfo& kernel, const mq_abi::Launch& launch,
                                     const size_t* buffer_bytes);
  // After the run's last add_dispatch: memory that no dispatch of the run may write (weights,
  // mostly) cannot race, so reads of it skip the shadow.
  void find_read_only_memory();
  WordShadow& device_word(uintptr_t address);
  const DispatchChecks& dispatch(uint32_t number) const { return *dispatches_[number]; }

 private:
  struct Page;  // shadow of 4 KiB of device memory
  CheckSet checks_;
  std::vector<std::unique_ptr<DispatchChecks>> dispatches_;
  std::unordered_map<uintptr_t, std::unique_ptr<Page>> pages_;
  uintptr_t last_page_number_ = ~uintptr_t(0);
  Page* last_page_ = nullptr;
};

// The threadgroup side, one per ThreadgroupRunner: thread identity, barrier epochs and the
// threadgroup-memory shadow of the group being run.
class GroupChecker {
 public:
  GroupChecker();
  ~GroupChecker();
  void begin_group(const DispatchChecks& dispatch, mq_abi::Dim3 group_position, const unsigned char* arena,
                   const std::vector<std::unique_ptr<FiberStack>>& stacks);
  void name_threadgroup_memory(std::string name, size_t offset, size_t size);
  void set_thread(uint32_t index);
  void threadgroup_barrier() { ++barrier_epoch_; }
  // A SIMD-group synchronises: its lanes' earlier accesses are ordered before later ones.
  void simd_sync(uint32_t simdgroup) { ++simd_epochs_[simdgroup]; }
  // False when the access races or is out of bounds; message() then says why.
  bool access(const void* address, size_t size, mq_abi::AccessKind kind, const void* pc);
  const std::string& message() const { return message_; }

 private:
  struct Variable {
    std::string name;
    size_t offset, size;
  };
  struct Conflict {
    const AccessRecord* other = nullptr;
    bool other_writes = false;
  };
  AccessRecord record_of(const void* pc, uint8_t mask) const;
  static Conflict shadow_update(WordShadow& word, const AccessRecord& now, bool write);
  bool report_race(const Conflict& conflict, const AccessRecord& now, bool write, const std::string& where);
  bool threadgroup_access(size_t offset, size_t size, bool write, const void* pc);
  bool device_access(const DispatchChecks::Binding& binding, uintptr_t address, size_t size, bool write,
                     const void* pc);
  bool is_private(uintptr_t address);
  bool out_of_bounds(const std::string& what, size_t size, bool write, const void* pc);
  std::string describe_thread(uint64_t who) const;
  std::string why_unordered(const AccessRecord& earlier, const AccessRecord& now) const;
  std::string buffer_name(const DispatchChecks::Binding& binding) const;
  const Variable* variable_near(size_t offset) const;

  const DispatchChecks* dispatch_ = nullptr;
  mq_abi::Dim3 group_position_{};
  uint64_t group_identity_ = 0;
  uintptr_t arena_ = 0;
  const std::vector<std::unique_ptr<FiberStack>>* stacks_ = nullptr;
  std::vector<std::pair<uintptr_t, uintptr_t>> sorted_stacks_;  // rebuilt when the runner grows
  uintptr_t stack_begin_ = 0, stack_size_ = 0;                  // the running thread's stack
  uintptr_t os_stack_begin_ = 0, os_stack_end_ = 0;             // the scheduler's stack
  std::vector<uintptr_t> image_pages_;  // 4 KiB pages found inside the kernel's library
  uint32_t thread_ = 0;
  uint32_t barrier_epoch_ = 0;
  uint32_t simd_epochs_[mq_abi::kMaxThreadsPerThreadgroup / mq_abi::kSimdWidth] = {};
  std::vector<Variable> variables_;
  std::vector<WordShadow> threadgroup_shadow_;  // one per word of the arena
  size_t shadow_used_ = 0;                      // words touched since the last clear
  std::string message_;
};

}  // namespace mq::cpu
