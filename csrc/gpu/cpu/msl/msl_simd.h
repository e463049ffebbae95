// SIMD-group (32 lanes) and quad-group (4 lanes) functions. Each lane hands the runtime
// a record on its stack; once every live lane of the SIMD-group has arrived at the same
// call, the runtime calls the collective function once with all 32 records (nullptr for
// lanes that exited or do not exist) and it writes every lane's result.
#pragma once
#include "msl_math.h"
#include "msl_sync.h"

namespace metal {

// A collective runs on the runtime's scheduler, outside every lane, so it never stops the
// dispatch itself: it notes a fault in the record of each lane concerned, and that lane
// reports it through mq_runtime->fail as soon as it runs again.
struct mq_fault {
  enum kind_t : uint8_t { none, inactive_source, outside_group, bad_modulo, delta_too_large, missing_lane };
  kind_t kind = none;
  uint8_t lane = 0;    // the lane at fault, or the one missing
  uint8_t source = 0;  // the inactive lane it read
  uint8_t width = 0;   // the function's group size
  uint32_t arg = 0;    // its lane argument, delta or modulo
};
[[noreturn]] inline void mq_report(const char* name, const mq_fault& f) {
  mq_message m;
  m << name << ": ";
  switch (f.kind) {
    case mq_fault::inactive_source:
      m << "lane " << ulong(f.lane) << " reads lane " << ulong(f.source)
        << ", which is inactive (exited or beyond the grid); a GPU returns an undefined value";
      break;
    case mq_fault::outside_group:
      m << "lane " << ulong(f.lane) << " asks for lane argument " << ulong(f.arg) << ", outside its "
        << ulong(f.width) << "-lane group";
      break;
    case mq_fault::bad_modulo: m << "modulo " << ulong(f.arg) << " is not 2, 4, 8, 16 or 32"; break;
    case mq_fault::delta_too_large: m << "delta " << ulong(f.arg) << " exceeds modulo " << ulong(f.width); break;
    case mq_fault::missing_lane:
      m << "lane " << ulong(f.lane)
        << " is inactive (exited or beyond the grid); SIMD-group matrix functions need all 32 lanes of the "
           "SIMD-group";
      break;
    case mq_fault::none: break;
  }
  mq_fail(m);
}

template <class L>
L* mq_lane_at(void* const* lanes, int i) {
  return static_cast<L*>(lanes[i]);
}
// Runs the collective `fn` with this lane's record (which has a `fault` member).
template <class L>
void mq_run(mq_abi::CollectiveFn fn, L& lane, mq_abi::Site site, const char* name) {
  mq_runtime->simd_collective(fn, &lane, site);
  if (lane.fault.kind != mq_fault::none) mq_report(name, lane.fault);
}

template <class T>
struct mq_lane {
  T value;
  T result;
  uint32_t arg;  // source lane, delta or mask
  mq_fault fault;
};
template <class T>
T mq_collective(mq_abi::CollectiveFn fn, const T& value, uint32_t arg, mq_abi::Site site, const char* name) {
  mq_lane<T> lane{value, value, arg, {}};
  mq_run(fn, lane, site, name);
  return lane.result;
}

struct mq_op_sum {
  static constexpr int identity = 0;
  template <class T>
  static T apply(const T& a, const T& b) { return T(a + b); }
};
struct mq_op_product {
  static constexpr int identity = 1;
  template <class T>
  static T apply(const T& a, const T& b) { return T(a * b); }
};
struct mq_op_min {
  template <class T>
  static T apply(const T& a, const T& b) { return min(a, b); }
};
struct mq_op_max {
  template <class T>
  static T apply(const T& a, const T& b) { return max(a, b); }
};
struct mq_op_and {
  template <class T>
  static T apply(const T& a, const T& b) { return T(a & b); }
};
struct mq_op_or {
  template <class T>
  static T apply(const T& a, const T& b) { return T(a | b); }
};
struct mq_op_xor {
  template <class T>
  static T apply(const T& a, const T& b) { return T(a ^ b); }
};

// Reduction order (fixed, so results do not depend on scheduling): within each group of
// Width lanes, a pairwise tree over lane numbers, level k combining the partial results of
// lanes i and i + 2^k (i a multiple of 2^(k+1)) as op(lower, upper), inactive lanes skipped.
// That is the butterfly order, which gives every lane the same bits.
template <class T, class Op, int Width>
void mq_reduce_fn(void* const* lanes) {
  for (int g = 0; g < 32; g += Width) {
    T part[Width];
    bool has[Width];
    for (int i = 0; i < Width; i++) {
      has[i] = lanes[g + i] != nullptr;
      if (has[i]) part[i] = mq_lane_at<mq_lane<T>>(lanes, g + i)->value;
    }
    for (int step = 1; step < Width; step *= 2)
      for (int i = 0; i + step < Width; i += 2 * step)
        if (has[i + step]) {
          part[i] = has[i] ? Op::apply(part[i], part[i + step]) : part[i + step];
          has[i] = true;
        }
    for (int i = 0; i < Width; i++)
      if (lanes[g + i]) mq_lane_at<mq_lane<T>>(lanes, g + i)->result = part[0];
  }
}

// Prefix scans accumulate the active lanes of a group in lane order.
template <class T, class Op, int Width, bool Inclusive>
void mq_prefix_fn(void* const* lanes) {
  for (int g = 0; g < 32; g += Width) {
    T acc = T(Op::identity);
    bool has = false;
    for (int i = g; i < g + Width; i++) {
      if (!lanes[i]) continue;
      auto* lane = mq_lane_at<mq_lane<T>>(lanes, i);
      if (!Inclusive) lane->result = acc;
      acc = has ? Op::apply(acc, lane->value) : lane->value;
      has = true;
      if (Inclusive) lane->result = acc;
    }
  }
}

#define MQ_REDUCTION(name, op, width)                                                 \
  template <class T>                                                                  \
  T name(T data, mq_abi::Site site = MQ_SITE) {                                       \
    return mq_collective(&mq_reduce_fn<T, op, width>, data, 0, site, #name);          \
  }
#define MQ_PREFIX(name, op, width, inclusive)                                         \
  template <class T>                                                                  \
  T name(T data, mq_abi::Site site = MQ_SITE) {                                       \
    return mq_collective(&mq_prefix_fn<T, op, width, inclusive>, data, 0, site, #name); \
  }
#define MQ_GROUP_REDUCTIONS(group, width)                                             \
  MQ_REDUCTION(group##_sum, mq_op_sum, width)                                         \
  MQ_REDUCTION(group##_product, mq_op_product, width)                                 \
  MQ_REDUCTION(group##_min, mq_op_min, width)                                         \
  MQ_REDUCTION(group##_max, mq_op_max, width)                                         \
  MQ_REDUCTION(group##_and, mq_op_and, width)                                         \
  MQ_REDUCTION(group##_or, mq_op_or, width)                                           \
  MQ_REDUCTION(group##_xor, mq_op_xor, width)                                         \
  MQ_PREFIX(group##_prefix_inclusive_sum, mq_op_sum, width, true)                     \
  MQ_PREFIX(group##_prefix_exclusive_sum, mq_op_sum, width, false)                    \
  MQ_PREFIX(group##_prefix_inclusive_product, mq_op_product, width, true)             \
  MQ_PREFIX(group##_prefix_exclusive_product, mq_op_product, width, false)            \
  inline bool group##_any(bool expr, mq_abi::Site site = MQ_SITE) {                   \
    return mq_collective(&mq_reduce_fn<bool, mq_op_or, width>, expr, 0, site, #group "_any"); \
  }                                                                                   \
  inline bool group##_all(bool expr, mq_abi::Site site = MQ_SITE) {                   \
    return mq_collective(&mq_reduce_fn<bool, mq_op_and, width>, expr, 0, site, #group "_all"); \
  }
MQ_GROUP_REDUCTIONS(simd, 32)
MQ_GROUP_REDUCTIONS(quad, 4)
#undef MQ_GROUP_REDUCTIONS
#undef MQ_PREFIX
#undef MQ_REDUCTION

// Which lane a shuffle reads: `lane` for simd_shuffle/broadcast (arg = source lane),
// xor_mask (arg = mask), up/down (arg = delta; a source outside the group keeps the
// lane's own value, as MSL leaves the lowest/highest delta lanes unmodified) and rotations.
enum class mq_shuffle { lane, broadcast, xor_mask, up, down, rotate_up, rotate_down };

// Reading a lane that is inactive (or outside the group) is undefined on a GPU: a fault.
template <class T, mq_shuffle K, int Width>
void mq_shuffle_fn(void* const* lanes) {
  for (int i = 0; i < 32; i++) {
    if (!lanes[i]) continue;
    auto* lane = mq_lane_at<mq_lane<T>>(lanes, i);
    const long base = i - i % Width, pos = i % Width, arg = lane->arg;
    long src = -1;
    switch (K) {
      case mq_shuffle::lane:
      case mq_shuffle::broadcast: src = arg < Width ? base + arg : -1; break;
      case mq_shuffle::xor_mask: src = (pos ^ arg) < Width ? base + (pos ^ arg) : -1; break;
      case mq_shuffle::up: src = pos - arg >= 0 ? i - arg : i; break;
      case mq_shuffle::down: src = pos + arg < Width ? i + arg : i; break;
      case mq_shuffle::rotate_up: src = base + ((pos - arg) % Width + Width) % Width; break;
      case mq_shuffle::rotate_down: src = base + (pos + arg) % Width; break;
    }
    if (src < 0)
      lane->fault = {mq_fault::outside_group, uint8_t(i), 0, uint8_t(Width), uint32_t(arg)};
    else if (!lanes[src])
      lane->fault = {mq_fault::inactive_source, uint8_t(i), uint8_t(src)};
    else
      lane->result = mq_lane_at<mq_lane<T>>(lanes, int(src))->value;
  }
}

#define MQ_SHUFFLE(name, kind, width, argname)                                        \
  template <class T>                                                                  \
  T name(T data, ushort argname, mq_abi::Site site = MQ_SITE) {                       \
    return mq_collective(&mq_shuffle_fn<T, mq_shuffle::kind, width>, data, argname, site, #name); \
  }
MQ_SHUFFLE(simd_shuffle, lane, 32, simd_lane_id)
MQ_SHUFFLE(simd_broadcast, broadcast, 32, broadcast_lane_id)
MQ_SHUFFLE(simd_shuffle_xor, xor_mask, 32, mask)
MQ_SHUFFLE(simd_shuffle_up, up, 32, delta)
MQ_SHUFFLE(simd_shuffle_down, down, 32, delta)
MQ_SHUFFLE(simd_shuffle_rotate_up, rotate_up, 32, delta)
MQ_SHUFFLE(simd_shuffle_rotate_down, rotate_down, 32, delta)
MQ_SHUFFLE(quad_shuffle, lane, 4, quad_lane_id)
MQ_SHUFFLE(quad_broadcast, broadcast, 4, broadcast_lane_id)
MQ_SHUFFLE(quad_shuffle_xor, xor_mask, 4, mask)
MQ_SHUFFLE(quad_shuffle_up, up, 4, delta)
MQ_SHUFFLE(quad_shuffle_down, down, 4, delta)
MQ_SHUFFLE(quad_shuffle_rotate_up, rotate_up, 4, delta)
MQ_SHUFFLE(quad_shuffle_rotate_down, rotate_down, 4, delta)
#undef MQ_SHUFFLE

// simd_shuffle_and_fill_down/up: lanes whose source falls off the end of their
// `modulo`-lane group read filling_data from the start (down) or end (up) of the group.
template <class T>
struct mq_fill_lane {
  T value, fill, result;
  uint32_t delta, modulo;
  mq_fault fault;
};
template <class T, bool Down>
void mq_shuffle_fill_fn(void* const* lanes) {
  for (int i = 0; i < 32; i++) {
    if (!lanes[i]) continue;
    auto* lane = mq_lane_at<mq_fill_lane<T>>(lanes, i);
    const long width = lane->modulo;
    if (width < 2 || width > 32 || (width & (width - 1))) {
      lane->fault = {mq_fault::bad_modulo, uint8_t(i), 0, 0, lane->modulo};
      continue;
    }
    const long base = i - i % width, pos = i % width;
    const long j = Down ? pos + long(lane->delta) : pos - long(lane->delta);
    const long src = base + (j < 0 ? j + width : j >= width ? j - width : j);
    if (src < base || src >= base + width)
      lane->fault = {mq_fault::delta_too_large, uint8_t(i), 0, uint8_t(width), lane->delta};
    else if (!lanes[src])
      lane->fault = {mq_fault::inactive_source, uint8_t(i), uint8_t(src)};
    else
      lane->result = j < 0 || j >= width ? mq_lane_at<mq_fill_lane<T>>(lanes, int(src))->fill
                                         : mq_lane_at<mq_fill_lane<T>>(lanes, int(src))->value;
  }
}
template <class T>
T simd_shuffle_and_fill_down(T data, T filling_data, ushort delta, ushort modulo = 32,
                             mq_abi::Site site = MQ_SITE) {
  mq_fill_lane<T> lane{data, filling_data, data, delta, modulo, {}};
  mq_run(&mq_shuffle_fill_fn<T, true>, lane, site, "simd_shuffle_and_fill_down");
  return lane.result;
}
template <class T>
T simd_shuffle_and_fill_up(T data, T filling_data, ushort delta, ushort modulo = 32, mq_abi::Site site = MQ_SITE) {
  mq_fill_lane<T> lane{data, filling_data, data, delta, modulo, {}};
  mq_run(&mq_shuffle_fill_fn<T, false>, lane, site, "simd_shuffle_and_fill_up");
  return lane.result;
}

// Lane i's bit is set when lane i is active and voted true. all() asks whether every
// active lane voted true, so it stays meaningful in a partial SIMD-group.
class simd_vote {
 public:
  typedef ulong vote_t;
  explicit constexpr simd_vote(vote_t v = 0) : bits_(v), active_(0xffffffffu) {}
  constexpr simd_vote(vote_t v, vote_t active) : bits_(v), active_(active) {}
  explicit constexpr operator vote_t() const { return bits_; }
  explicit constexpr operator bool() const { return any(); }
  constexpr bool all() const { return (bits_ & active_) == active_; }
  constexpr bool any() const { return bits_ != 0; }

 private:
  vote_t bits_, active_;
};

struct mq_vote_lane {
  bool vote;
  ulong bits, active;
};
inline void mq_ballot_fn(void* const* lanes) {
  ulong bits = 0, active = 0;
  for (int i = 0; i < 32; i++)
    if (lanes[i]) {
      active |= 1ul << i;
      if (mq_lane_at<mq_vote_lane>(lanes, i)->vote) bits |= 1ul << i;
    }
  for (int i = 0; i < 32; i++)
    if (lanes[i]) {
      mq_lane_at<mq_vote_lane>(lanes, i)->bits = bits;
      mq_lane_at<mq_vote_lane>(lanes, i)->active = active;
    }
}
inline simd_vote simd_ballot(bool expr, mq_abi::Site site = MQ_SITE) {
  mq_vote_lane lane{expr, 0, 0};
  mq_runtime->simd_collective(&mq_ballot_fn, &lane, site);
  return simd_vote(lane.bits, lane.active);
}
inline simd_vote simd_active_threads_mask(mq_abi::Site site = MQ_SITE) { return simd_ballot(true, site); }
inline void mq_is_first_fn(void* const* lanes) {
  bool first = true;
  for (int i = 0; i < 32; i++)
    if (lanes[i]) {
      mq_lane_at<mq_lane<bool>>(lanes, i)->result = first;
      first = false;
    }
}
inline bool simd_is_first(mq_abi::Site site = MQ_SITE) {
  return mq_collective(&mq_is_first_fn, false, 0, site, "simd_is_first");
}

template <class T>
void mq_broadcast_first_fn(void* const* lanes) {
  int first = 0;
  while (!lanes[first]) first++;
  for (int i = first; i < 32; i++)
    if (lanes[i]) mq_lane_at<mq_lane<T>>(lanes, i)->result = mq_lane_at<mq_lane<T>>(lanes, first)->value;
}
template <class T>
T simd_broadcast_first(T data, mq_abi::Site site = MQ_SITE) {
  return mq_collective(&mq_broadcast_first_fn<T>, data, 0, site, "simd_broadcast_first");
}

// Compute dispatches have no helper threads.
constexpr bool simd_is_helper_thread() { return false; }

}  // namespace metal
