#include "access_checker.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "../device.h"
#include "pc_lines.h"

namespace mq::cpu {
namespace {

// A thread's identity in a run: dispatch (16 bits), threadgroup (37 bits), thread (11 bits).
constexpr unsigned kThreadBits = 11, kGroupBits = 37;
uint64_t thread_identity(uint64_t group_identity, uint32_t thread) { return group_identity | thread; }
uint64_t group_of(uint64_t who) { return who >> kThreadBits; }  // dispatch and threadgroup
uint32_t dispatch_of(uint64_t who) { return uint32_t(who >> (kThreadBits + kGroupBits)) - 1; }
uint32_t thread_of(uint64_t who) { return uint32_t(who & ((1u << kThreadBits) - 1)); }
uint32_t simdgroup_of(uint64_t who) { return thread_of(who) / mq_abi::kSimdWidth; }

constexpr size_t kPageWords = 1024;  // a shadow page covers 4 KiB of device memory

std::string dim3(const mq_abi::Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

// Whether no barrier orders `earlier` before `now` (the later access of the pair).
bool unordered(const AccessRecord& earlier, const AccessRecord& now) {
  if (earlier.who == 0 || earlier.who == now.who) return false;
  if (group_of(earlier.who) != group_of(now.who)) return true;  // other threadgroup or dispatch
  if (earlier.barrier_epoch != now.barrier_epoch) return false;
  return simdgroup_of(earlier.who) != simdgroup_of(now.who) || earlier.simd_epoch == now.simd_epoch;
}

const char* access_name(bool write) { return write ? "write" : "read"; }

// The load address of the shared object holding `address`, or 0.
uintptr_t image_base_of(const void* address) {
  Dl_info info{};
  return dladdr(address, &info) ? reinterpret_cast<uintptr_t>(info.dli_fbase) : 0;
}

// The calling OS thread's stack, where collectives run and keep their lane pointers.
std::pair<uintptr_t, uintptr_t> this_thread_stack() {
#if defined(__APPLE__)
  const auto top = reinterpret_cast<uintptr_t>(pthread_get_stackaddr_np(pthread_self()));
  return {top - pthread_get_stacksize_np(pthread_self()), top};
#else
  pthread_attr_t attr;
  void* base = nullptr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &base, &size);
    pthread_attr_destroy(&attr);
  }
  return {reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base) + size};
#endif
}

}  // namespace

CheckSet parse_checks(const std::vector<std::string>& names) {
  std::vector<std::string> list = names;
  if (list.empty()) {
    const char* env = std::getenv("METALQWEN_CPU_CHECKS");
    std::istringstream text(env ? env : "");
    for (std::string name; std::getline(text, name, ',');)
      if (!name.empty()) list.push_back(name);
  }
  CheckSet checks;
  for (const std::string& name : list) {
    if (name == "races") checks.races = true;
    else if (name == "bounds") checks.bounds = true;
    else throw gpu::GpuError("[cpu] unknown check '" + name + "' (expected \"races\" or \"bounds\")");
  }
  return checks;
}

struct RunChecker::Page {
  WordShadow words[kPageWords];
};

RunChecker::RunChecker(CheckSet checks) : checks_(checks) {}
RunChecker::~RunChecker() = default;

const DispatchChecks& RunChecker::add_dispatch(const mq_abi::KernelInfo& kernel, const mq_abi::Launch& launch,
                                               const size_t* buffer_bytes) {
  auto d = std::make_unique<DispatchChecks>();
  d->checks = checks_;
  d->run = this;
  d->number = uint32_t(dispatches_.size());
  d->kernel = &kernel;
  d->groups = launch.threadgroups_per_grid;
  for (uint32_t i = 0; i < mq_abi::kMaxBufferIndex; ++i)
    if (buffer_bytes[i]) {
      const auto begin = reinterpret_cast<uintptr_t>(launch.buffers[i]);
      bool writable = false;
      for (uint32_t p = 0; p < kernel.param_count; ++p)
        writable |= kernel.params[p].kind != mq_abi::ParamKind::threadgroup_pointer && kernel.params[p].index == i &&
                    !kernel.params[p].read_only;
      d->bindings.push_back({begin, begin + buffer_bytes[i], i, writable});
    }
  d->image_base = image_base_of(reinterpret_cast<const void*>(kernel.entry));
  dispatches_.push_back(std::move(d));
  return *dispatches_.back();
}

void RunChecker::find_read_only_memory() {
  for (auto& d : dispatches_)
    for (auto& b : d->bindings) {
      b.shared_with_writer = false;
      for (const auto& other : dispatches_)
        for (const auto& w : other->bindings) b.shared_with_writer |= w.writable && w.begin < b.end && b.begin < w.end;
    }
}

WordShadow& RunChecker::device_word(uintptr_t address) {
  const uintptr_t word = address / 4, page = word / kPageWords;
  if (page != last_page_number_) {
    auto& slot = pages_[page];
    if (!slot) slot = std::make_unique<Page>();
    last_page_number_ = page;
    last_page_ = slot.get();
  }
  return last_page_->words[word % kPageWords];
}

GroupChecker::GroupChecker() : threadgroup_shadow_(mq_abi::kMaxThreadgroupMemory / 4) {
  std::tie(os_stack_begin_, os_stack_end_) = this_thread_stack();
}

GroupChecker::~GroupChecker() = default;

void GroupChecker::begin_group(const DispatchChecks& dispatch, mq_abi::Dim3 group_position, const unsigned char* arena,
                               const std::vector<std::unique_ptr<FiberStack>>& stacks) {
  image_pages_.clear();  // libraries come and go between groups
  dispatch_ = &dispatch;
  group_position_ = group_position;
  const mq_abi::Dim3 g = dispatch.groups;
  const uint64_t linear = group_position.x + uint64_t(g.x) * (group_position.y + uint64_t(g.y) * group_position.z);
  group_identity_ = (uint64_t(dispatch.number + 1) << kGroupBits | linear) << kThreadBits;
  arena_ = reinterpret_cast<uintptr_t>(arena);
  stacks_ = &stacks;
  barrier_epoch_ = 0;
  std::fill(std::begin(simd_epochs_), std::end(simd_epochs_), 0u);
  variables_.clear();
  std::fill(threadgroup_shadow_.begin(), threadgroup_shadow_.begin() + shadow_used_, WordShadow{});
  shadow_used_ = 0;
}

void GroupChecker::name_threadgroup_memory(std::string name, size_t offset, size_t size) {
  variables_.push_back({std::move(name), offset, size});
}

void GroupChecker::set_thread(uint32_t index) {
  thread_ = index;
  const FiberStack& stack = *(*stacks_)[index];
  stack_begin_ = reinterpret_cast<uintptr_t>(stack.base());
  stack_size_ = stack.size();
}

AccessRecord GroupChecker::record_of(const void* pc, uint8_t mask) const {
  return {thread_identity(group_identity_, thread_), pc, barrier_epoch_, simd_epochs_[thread_ / mq_abi::kSimdWidth],
          mask};
}

bool GroupChecker::access(const void* address, size_t size, mq_abi::AccessKind kind, const void* pc) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  if (a - stack_begin_ < stack_size_) return true;  // the thread's own stack: private
  const bool write = kind == mq_abi::AccessKind::write;
  if (a - arena_ < mq_abi::kMaxThreadgroupMemory) return threadgroup_access(a - arena_, size, write, pc);
  const DispatchChecks::Binding* inside = nullptr;
  for (const auto& b : dispatch_->bindings)
    if (a - b.begin < b.end - b.begin && (!inside || b.end > inside->end)) inside = &b;
  if (inside && a + size <= inside->end) return device_access(*inside, a, size, write, pc);
  if (!inside && is_private(a)) return true;
  if (!dispatch_->checks.bounds) return true;
  // Outside every binding: name the nearest one, the buffer the kernel most likely meant.
  const DispatchChecks::Binding* nearest = inside;
  uintptr_t best = ~uintptr_t(0);
  for (const auto& b : dispatch_->bindings) {
    const uintptr_t distance = a >= b.end ? a - b.end : a < b.begin ? b.begin - a : 0;
    if (!nearest || distance < best) nearest = &b, best = distance;
  }
  if (!nearest) return out_of_bounds("memory that no argument binds", size, write, pc);
  const auto offset = static_cast<long long>(a - nearest->begin);
  return out_of_bounds("byte " + std::to_string(offset) + " of " + buffer_name(*nearest) + ", which has " +
                           std::to_string(nearest->end - nearest->begin) + " bytes bound",
                       size, write, pc);
}

bool GroupChecker::is_private(uintptr_t a) {
  if (a - os_stack_begin_ < os_stack_end_ - os_stack_begin_) return true;  // collectives' lane pointers
  if (sorted_stacks_.size() != stacks_->size()) {
    sorted_stacks_.clear();
    for (const auto& s : *stacks_)
      sorted_stacks_.push_back({reinterpret_cast<uintptr_t>(s->base()), reinterpret_cast<uintptr_t>(s->top())});
    std::sort(sorted_stacks_.begin(), sorted_stacks_.end());
  }
  auto it = std::upper_bound(sorted_stacks_.begin(), sorted_stacks_.end(), std::make_pair(a, ~uintptr_t(0)));
  if (it != sorted_stacks_.begin() && a < std::prev(it)->second) return true;  // another lane's stack
  // The kernel library's own globals (constant tables, its runtime table): known pages, else dladdr.
  const uintptr_t page = a >> 12;
  if (std::find(image_pages_.begin(), image_pages_.end(), page) != image_pages_.end()) return true;
  if (dispatch_->image_base && image_base_of(reinterpret_cast<const void*>(a)) == dispatch_->image_base) {
    image_pages_.push_back(page);
    return true;
  }
  return false;
}

const GroupChecker::Variable* GroupChecker::variable_near(size_t offset) const {
  const Variable* best = nullptr;
  for (const Variable& v : variables_)
    if (v.offset <= offset && (!best || v.offset > best->offset)) best = &v;
  return best;
}

bool GroupChecker::threadgroup_access(size_t offset, size_t size, bool write, const void* pc) {
  const Variable* v = variable_near(offset);
  if (!v || offset + size > v->offset + v->size) {
    if (!dispatch_->checks.bounds) return true;
    const std::string where = v ? "byte " + std::to_string(offset - v->offset) + " of threadgroup variable '" +
                                      v->name + "' (" + std::to_string(v->size) + " bytes)"
                                : "threadgroup memory before every variable";
    return out_of_bounds(where, size, write, pc);
  }
  if (!dispatch_->checks.races) return true;
  shadow_used_ = std::max(shadow_used_, (offset + size + 3) / 4);
  for (size_t byte = offset; byte < offset + size;) {
    const size_t word = byte / 4, end = std::min(offset + size, word * 4 + 4);
    const AccessRecord now = record_of(pc, uint8_t(((1u << (end - byte)) - 1) << (byte % 4)));
    if (const Conflict c = shadow_update(threadgroup_shadow_[word], now, write); c.other)
      return report_race(c, now, write,
                         "byte " + std::to_string(byte - v->offset) + " of threadgroup variable '" + v->name + "'");
    byte = end;
  }
  return true;
}

bool GroupChecker::device_access(const DispatchChecks::Binding& binding, uintptr_t address, size_t size, bool write,
                                 const void* pc) {
  if (!dispatch_->checks.races || (!write && !binding.shared_with_writer)) return true;
  for (uintptr_t byte = address; byte < address + size;) {
    const uintptr_t end = std::min<uintptr_t>(address + size, (byte & ~uintptr_t(3)) + 4);
    const uint8_t mask = uint8_t(((1u << (end - byte)) - 1) << (byte % 4));
    const AccessRecord now = record_of(pc, mask);
    if (const Conflict c = shadow_update(dispatch_->run->device_word(byte), now, write); c.other)
      return report_race(c, now, write, "byte " + std::to_string(byte - binding.begin) + " of " + buffer_name(binding));
    byte = end;
  }
  return true;
}

// The first access in the word's history that no barrier orders before `now` and that
// conflicts with it; when there is none, `now` joins the history.
GroupChecker::Conflict GroupChecker::shadow_update(WordShadow& word, const AccessRecord& now, bool write) {
  if ((word.write.mask & now.mask) && unordered(word.write, now)) return {&word.write, true};
  for (const AccessRecord& r : word.reads)
    if (write && (r.mask & now.mask) && unordered(r, now)) return {&r, false};
  if (write) {
    const uint8_t kept = word.write.who == now.who ? word.write.mask : 0;
    word.write = now;
    word.write.mask |= kept;
    return {};
  }
  // Keep reads by distinct threads that later writes could race with; a read that a barrier
  // orders before this one can go: anything unordered with it is unordered with this one too.
  for (AccessRecord& r : word.reads)
    if (r.who == now.who) {
      const uint8_t kept = r.mask;
      r = now;
      r.mask |= kept;
      return {};
    }
  for (AccessRecord& r : word.reads)
    if (r.who == 0 || !unordered(r, now)) {
      r = now;
      return {};
    }
  return {};
}

bool GroupChecker::report_race(const Conflict& c, const AccessRecord& now, bool write, const std::string& where) {
  const std::string kind = !c.other_writes ? "write after read" : write ? "write after write" : "read after write";
  message_ = "data race (" + kind + ") on " + where + ": " + access_name(write) + " at " + msl_line_of(now.pc) + ", " +
             access_name(c.other_writes) + " by " + describe_thread(c.other->who) + " at " + msl_line_of(c.other->pc) +
             "; " + why_unordered(*c.other, now);
  return false;
}

bool GroupChecker::out_of_bounds(const std::string& what, size_t size, bool write, const void* pc) {
  message_ = "out-of-bounds " + std::string(access_name(write)) + " of " + std::to_string(size) + " bytes at " + what +
             ", at " + msl_line_of(pc);
  return false;
}

std::string GroupChecker::describe_thread(uint64_t who) const {
  const std::string thread = "thread " + std::to_string(thread_of(who));
  if (group_of(who) == group_of(group_identity_)) return thread;
  const DispatchChecks& d = dispatch_->run->dispatch(dispatch_of(who));
  const uint64_t linear = group_of(who) & ((uint64_t(1) << kGroupBits) - 1);
  const mq_abi::Dim3 pos = {uint32_t(linear % d.groups.x), uint32_t(linear / d.groups.x % d.groups.y),
                            uint32_t(linear / d.groups.x / d.groups.y)};
  std::string text = thread + " of threadgroup " + dim3(pos);
  if (&d != dispatch_) text += " of a dispatch of kernel '" + std::string(d.kernel->name) + "'";
  return text;
}

std::string GroupChecker::why_unordered(const AccessRecord& earlier, const AccessRecord& now) const {
  if (dispatch_of(earlier.who) != dispatch_of(now.who))
    return "dispatches with no barrier between them may run in any order";
  if (group_of(earlier.who) != group_of(now.who)) return "threadgroups of a dispatch are not ordered";
  if (simdgroup_of(earlier.who) != simdgroup_of(now.who))
    return "no threadgroup_barrier between them (other SIMD-groups are not ordered by simdgroup_barrier)";
  return "no barrier between them";
}

std::string GroupChecker::buffer_name(const DispatchChecks::Binding& binding) const {
  std::string name = "buffer(" + std::to_string(binding.index) + ")";
  for (uint32_t p = 0; p < dispatch_->kernel->param_count; ++p) {
    const mq_abi::ParamInfo& param = dispatch_->kernel->params[p];
    if (param.kind != mq_abi::ParamKind::threadgroup_pointer && param.index == binding.index)
      return name + " '" + param.name + "'";
  }
  return name;
}

}  // namespace mq::cpu
