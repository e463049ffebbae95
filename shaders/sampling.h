// Token selection on the GPU: penalties, logit_bias, grammar token masks, greedy argmax in two stages, and an exact,
// deterministic temperature / top-k / top-p / min-p sampler. Both write ids into a device buffer so decode can
// run ahead of the CPU. Layouts and dispatch geometry: shaders/params/sampling.h.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

namespace mq_sample {

constant constexpr uint NO_INDEX = 0xFFFFFFFFu;
constant constexpr uint CAP = MQ_SAMPLE_CAP;

// NaN test on the bits: fast math may fold isnan() to false.
inline bool is_nan(float v) { return (as_type<uint>(v) & 0x7FFFFFFFu) > 0x7F800000u; }

// Order-preserving float -> uint map (a < b  <=>  key(a) < key(b)); both zeros map to
// the key of +0 so equal values always share a key.
inline uint key_of(float v) {
  const uint u = as_type<uint>(v);
  if ((u & 0x7FFFFFFFu) == 0u) return 0x80000000u;
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
inline float value_of(uint k) { return as_type<float>((k & 0x80000000u) != 0u ? (k & 0x7FFFFFFFu) : ~k); }

constant constexpr uint KEY_NEG_INF = 0x007FFFFFu;  // key_of(-INFINITY)
constant constexpr uint KEY_POS_INF = 0xFF800000u;  // key_of(+INFINITY)

// Threadgroup reductions: a SIMD-group reduction, then every thread folds the
// per-SIMD-group results in index order, so all threads get the same bits and the order
// is fixed for a given threadgroup size. The leading barrier lets `scratch` be reused
// by consecutive calls. `scratch` holds >= 32 entries.
inline float tg_sum(float v, threadgroup float* scratch, uint sg, uint n_sg, uint lane) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint i = 0; i < n_sg; i++) total += scratch[i];
  return total;
}

inline uint tg_sum(uint v, threadgroup uint* scratch, uint sg, uint n_sg, uint lane) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint total = 0;
  for (uint i = 0; i < n_sg; i++) total += scratch[i];
  return total;
}

inline uint tg_max(uint v, threadgroup uint* scratch, uint sg, uint n_sg, uint lane) {
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint m = scratch[0];
  for (uint i = 1; i < n_sg; i++) m = max(m, scratch[i]);
  return m;
}

inline uint tg_min(uint v, threadgroup uint* scratch, uint sg, uint n_sg, uint lane) {
  v = simd_min(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint m = scratch[0];
  for (uint i = 1; i < n_sg; i++) m = min(m, scratch[i]);
  return m;
}

// Exclusive prefix sum of v over threads in thread order; `total` gets the sum of all.
inline float tg_exclusive_scan(float v, threadgroup float* scratch, uint sg, uint n_sg, uint lane,
                               thread float& total) {
  const float within = simd_prefix_exclusive_sum(v);
  const float group = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) scratch[sg] = group;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float base = 0.0f;
  total = 0.0f;
  for (uint i = 0; i < n_sg; i++) {
    if (i == sg) base = total;
    total += scratch[i];
  }
  return base + within;
}

// Sorts keys[0, size) descending (size a power of two), moving w along: a bitonic network.
inline void sort_desc(threadgroup uint* keys, threadgroup float* w, uint size, uint tid, uint tpg) {
  for (uint k = 2; k <= size; k <<= 1) {
    for (uint j = k >> 1; j > 0; j >>= 1) {
      for (uint i = tid; i < size; i += tpg) {
        const uint l = i ^ j;
        if (l > i) {
          const uint ki = keys[i];
          const uint kl = keys[l];
          const bool desc = (i & k) == 0;
          if (desc ? ki < kl : ki > kl) {
            keys[i] = kl;
            keys[l] = ki;
            const float t = w[i];
            w[i] = w[l];
            w[l] = t;
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}

inline uint pow2_ceil(uint v) {
  uint p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Philox4x32-10 (Salmon et al., SC'11), first output word.
inline uint philox4x32_10(uint4 ctr, uint2 key) {
  for (uint round = 0; round < 10; round++) {
    if (round > 0) key += uint2(0x9E3779B9u, 0xBB67AE85u);
    const ulong p0 = (ulong)0xD2511F53u * ctr.x;
    const ulong p1 = (ulong)0xCD9E8D57u * ctr.z;
    ctr = uint4((uint)(p1 >> 32) ^ ctr.y ^ key.x, (uint)p1, (uint)(p0 >> 32) ^ ctr.w ^ key.y, (uint)p0);
  }
  return ctr.x;
}

// Index of the first candidate j (in array order) whose inclusive prefix sum of w,
// plus `base`, reaches need_abs + need_frac * (sum of w[0, count)); `count` if none.
// Each thread scans a contiguous block, so the prefix order is the array order.
inline uint first_reaching(threadgroup const float* w, uint count, float base, float need_abs, float need_frac,
                           threadgroup float* scratch_f, threadgroup uint* scratch_u, uint tid, uint tpg, uint sg,
                           uint n_sg, uint lane) {
  const uint per = (count + tpg - 1) / tpg;
  const uint j0 = min(tid * per, count);
  const uint j1 = min(j0 + per, count);
  float s = 0.0f;
  for (uint j = j0; j < j1; j++) s += w[j];
  float total;
  const float before = tg_exclusive_scan(s, scratch_f, sg, n_sg, lane, total);
  const float need = need_abs + need_frac * total;
  uint found = count;
  float run = 0.0f;
  for (uint j = j0; j < j1; j++) {
    run += w[j];
    if (base + (before + run) >= need) {
      found = j;
      break;
    }
  }
  return tg_min(found, scratch_u, sg, n_sg, lane);
}

}  // namespace mq_sample

// Stage 1 of argmax: the best (value, lowest index) of one chunk of a row.
//   logits [rows][row_stride]; partials uint2 [rows][n_partials] out.
// Grid: (n_partials, rows) threadgroups, any multiple of 32 threads.
[[kernel]] void argmax_partial(device const float* logits [[buffer(0)]],
                               device uint2* partials [[buffer(1)]],
                               constant ArgmaxParams& p [[buffer(2)]],
                               uint2 group [[threadgroup_position_in_grid]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint tpg [[threads_per_threadgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]],
                               uint n_sg [[simdgroups_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_sample;
  threadgroup uint scratch[32];
  device const float* row = logits + (ulong)group.y * p.row_stride;
  const uint end = min(p.n, (group.x + 1) * p.chunk);
  uint best = 0;  // key; 0 is below every non-NaN value's key
  uint best_i = NO_INDEX;
  for (uint i = group.x * p.chunk + tid; i < end; i += tpg) {
    const float v = row[i];
    const uint k = is_nan(v) ? 0u : key_of(v);
    if (k > best || (k == best && k != 0u && i < best_i)) {
      best = k;
      best_i = i;
    }
  }
  const uint top = tg_max(best, scratch, sg, n_sg, lane);
  const uint idx = tg_min(best == top ? best_i : NO_INDEX, scratch, sg, n_sg, lane);
  if (tid == 0) partials[(ulong)group.y * p.n_partials + group.x] = uint2(top, idx);
}

// Stage 2 of argmax: reduce a row's partials, write the winner to ids[out_pos + row].
//   partials uint2 [rows][n_partials] (as stage 1 writes them: (key, index)); ids uint.
// Grid: (rows) threadgroups, any multiple of 32 threads.
[[kernel]] void argmax_final(device const uint2* partials [[buffer(0)]],
                             device uint* ids [[buffer(1)]],
                             constant ArgmaxParams& p [[buffer(2)]],
                             uint row [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]],
                             uint tpg [[threads_per_threadgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint n_sg [[simdgroups_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_sample;
  threadgroup uint scratch[32];
  device const uint2* part = partials + (ulong)row * p.n_partials;
  uint best = 0;
  uint best_i = NO_INDEX;
  for (uint g = tid; g < p.n_partials; g += tpg) {
    const uint2 c = part[g];
    if (c.x > best || (c.x == best && c.y < best_i)) {
      best = c.x;
      best_i = c.y;
    }
  }
  const uint top = tg_max(best, scratch, sg, n_sg, lane);
  const uint idx = tg_min(best == top ? best_i : NO_INDEX, scratch, sg, n_sg, lane);
  if (tid == 0) ids[p.out_pos + row] = idx == NO_INDEX ? 0u : idx;
}

// The sampler. Definition (what the numpy reference implements):
//   NaN logits count as -inf; m = max logit; w_i = exp((l_i - m) / T) (temperature first,
//   as HF/vLLM do). top-k keeps l_i >= the k-th largest logit (ties kept). top-p then
//   keeps, among those, l_i >= tau where tau is the largest logit whose kept mass
//   sum(w_j : l_j >= tau) reaches top_p * (kept mass): the smallest top set reaching
//   top_p, ties kept. min-p then keeps w_i >= min_p (probability >= min_p times the top
//   one's, as HF and vLLM define it; w of the top logit is 1, so this never empties the
//   set and commutes with renormalisation). The draw is by inverse CDF in index order: u = (philox >> 8) 2^-24,
//   token = first kept i whose prefix sum of w exceeds u * (sum of kept w).
// Algorithm, without sorting the vocabulary (keys = order-preserving uint images of
// the logits). Pass 1 finds m, the argmax, and per thread its maximum and its mass.
// The per-thread maxima are distinct entries: sorted (bitonic, in threadgroup memory)
// they give lower bounds: the k-th largest logit is >= the k-th largest thread
// maximum, and the top-p threshold is >= the thread maximum at which their cumulative
// weight reaches top_p * mass. The threshold is then searched in the key bracket
// [bound, max]: each pass over the row counts (top-k) or weighs (top-p) the entries
// above a midpoint (value midpoint for 12 iterations, key midpoint after, so the
// bisection ends within ~44 passes) and at the same time gathers the bracket's entries
// into threadgroup memory; once the bracket holds at most MQ_SAMPLE_CAP entries they
// are sorted there and the threshold is read off exactly. One last pass draws.
// Passes over the 248320 logits (measured): 3 with top-k <= threads, or with top-p
// on a confident distribution; 2 with neither; 8-12 with top-p alone over a flat
// distribution (thousands of tokens in the nucleus) or top-k > threads.
// All sums run in a fixed order (tg_* above), so the draw is deterministic.
// In draft mode (params/sampling.h) a verify row first tests its draft, then draws from
// the rest.
//   logits [rows][row_stride]; ids uint, ids[out_pos + row] out; draft_ids uint (read
//   only in draft mode; may be ids).
// Grid: (rows) threadgroups of 32..MQ_SAMPLE_THREADS threads (a multiple of 32).
[[max_total_threads_per_threadgroup(MQ_SAMPLE_THREADS)]]
[[kernel]] void sample_top_kp(device const float* logits [[buffer(0)]],
                              device uint* ids [[buffer(1)]],
                              constant SampleParams& p [[buffer(2)]],
                              device const uint* draft_ids [[buffer(3)]],
                              uint row [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint tpg [[threads_per_threadgroup]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint n_sg [[simdgroups_per_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_sample;
  threadgroup uint cand_key[CAP];
  threadgroup float cand_w[CAP];
  threadgroup atomic_uint cand_count;
  threadgroup float scratch_f[32];
  threadgroup uint scratch_u[32];

  device const float* lrow = logits + (ulong)row * p.row_stride;
  const uint n = p.n;

  // Pass 1: max key and its lowest index, smallest finite key, finite count, and per
  // thread its max key and the mass sum exp((v - own max) / T) of its finite entries
  // (rescaled whenever the thread's max rises, as in online softmax).
  const float inv_t = p.temperature > 0.0f ? 1.0f / p.temperature : 0.0f;
  uint my_max = 0;
  uint my_max_i = NO_INDEX;
  uint my_min = 0xFFFFFFFFu;
  uint my_finite = 0;
  float my_top = 0.0f;   // the thread's largest finite value, once my_mass > 0
  float my_mass = 0.0f;
  for (uint i = tid; i < n; i += tpg) {
    const float v = lrow[i];
    const uint k = is_nan(v) ? KEY_NEG_INF : key_of(v);
    if (my_max_i == NO_INDEX || k > my_max) {  // indices ascend: ties keep the lowest
      my_max = k;
      my_max_i = i;
    }
    if (k > KEY_NEG_INF && k < KEY_POS_INF) {
      my_min = min(my_min, k);
      my_finite++;
      if (my_mass == 0.0f || v > my_top) {
        my_mass = my_mass == 0.0f ? 1.0f : fma(my_mass, exp((my_top - v) * inv_t), 1.0f);
        my_top = v;
      } else {
        my_mass += exp((v - my_top) * inv_t);
      }
    }
  }
  const uint kmax = tg_max(my_max, scratch_u, sg, n_sg, lane);
  const uint argmax = tg_min(my_max == kmax ? my_max_i : NO_INDEX, scratch_u, sg, n_sg, lane);
  const uint kmin = tg_min(my_min, scratch_u, sg, n_sg, lane);
  const uint n_finite = tg_sum(my_finite, scratch_u, sg, n_sg, lane);

  // Greedy when sampling is meaningless: T <= 0 (not routed here), a max that is not finite.
  if (!(p.temperature > 0.0f) || kmax <= KEY_NEG_INF || kmax >= KEY_POS_INF) {
    if (tid == 0) ids[p.out_pos + row] = argmax == NO_INDEX ? 0u : argmax;
    return;
  }
  const float m = value_of(kmax);
  const float my_top_w = my_mass > 0.0f ? exp((my_top - m) * inv_t) : 0.0f;  // w of the thread's max
  const float mass_all = tg_sum(my_mass * my_top_w, scratch_f, sg, n_sg, lane);

  const bool use_k = p.top_k > 0 && p.top_k < n_finite;
  const bool use_p = p.top_p < 1.0f;

  // Lower bounds from the per-thread maxima (distinct entries), sorted descending with
  // their weights: k of them are >= the k-th, so the k-th largest logit is >= it; and
  // once the heaviest j of them reach top_p * mass_all, the top-p threshold is >= the
  // j-th. Either usually leaves a bracket small enough to gather in one pass.
  uint bound_k = kmin;
  uint bound_p = kmin;
  const float need_p = p.top_p * mass_all;  // the top-p target when top-k is off
  if ((use_k && p.top_k <= tpg) || (use_p && !use_k)) {
    const uint size = pow2_ceil(tpg);
    for (uint i = tid; i < size; i += tpg) {
      cand_key[i] = 0u;
      cand_w[i] = 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    cand_key[tid] = my_max;
    cand_w[tid] = my_top_w;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    sort_desc(cand_key, cand_w, size, tid, tpg);
    if (use_k && p.top_k <= tpg) bound_k = max(kmin, cand_key[p.top_k - 1]);
    if (use_p && !use_k) {
      const uint j = first_reaching(cand_w, size, 0.0f, need_p, 0.0f, scratch_f, scratch_u, tid, tpg, sg, n_sg,
                                    lane);
      if (j < size) bound_p = max(kmin, cand_key[j]);
    }
  }

  uint tau = kmin;            // kept: key >= tau
  bool all_gathered = false;  // cand_* hold every entry with key >= tau, sorted descending
  uint n_cand = 0;
  for (uint phase = 0; phase < 2; phase++) {
    const bool count_mode = phase == 0;
    if (count_mode ? !use_k : !use_p) continue;

    if (!count_mode && all_gathered) {
      // top-p inside the gathered top-k set: W = mass of the kept prefix of the sorted list.
      uint kept = 0;
      for (uint j = tid; j < n_cand; j += tpg) kept += cand_key[j] >= tau ? 1u : 0u;
      kept = tg_sum(kept, scratch_u, sg, n_sg, lane);
      const uint j = first_reaching(cand_w, kept, 0.0f, 0.0f, p.top_p, scratch_f, scratch_u, tid, tpg, sg, n_sg,
                                    lane);
      tau = cand_key[min(j, kept - 1)];
      continue;
    }

    // Invariant: the answer lies in [a, b); entries with key >= b number base_count
    // and weigh base_mass.
    uint a = count_mode ? bound_k : (use_k ? tau : bound_p);
    uint b = kmax + 1;
    const uint need_count = p.top_k;
    float need_mass = need_p;  // after a partial top-k, set from the kept mass below
    uint base_count = 0;  // entries with key >= b
    float base_mass = 0.0f;
    uint answer = a;
    for (uint iter = 0; b - a > 1; iter++) {
      uint mid = 0;
      if (iter < 12) mid = key_of(value_of(a) * 0.5f + value_of(b - 1) * 0.5f);
      if (mid <= a || mid >= b) mid = a + (b - a) / 2;

      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (tid == 0) atomic_store_explicit(&cand_count, 0u, memory_order_relaxed);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      uint c_in = 0, c_hi = 0;
      float m_in = 0.0f, m_hi = 0.0f;
      for (uint i = tid; i < n; i += tpg) {
        const float v = lrow[i];
        const uint k = is_nan(v) ? KEY_NEG_INF : key_of(v);
        if (k < a || k >= b) continue;
        const float w = exp((v - m) * inv_t);
        c_in++;
        m_in += w;
        if (k >= mid) {
          c_hi++;
          m_hi += w;
        }
        if (atomic_load_explicit(&cand_count, memory_order_relaxed) < CAP) {
          const uint slot = atomic_fetch_add_explicit(&cand_count, 1u, memory_order_relaxed);
          if (slot < CAP) {
            cand_key[slot] = k;
            cand_w[slot] = w;
          }
        }
      }
      c_in = tg_sum(c_in, scratch_u, sg, n_sg, lane);
      c_hi = tg_sum(c_hi, scratch_u, sg, n_sg, lane);
      m_in = tg_sum(m_in, scratch_f, sg, n_sg, lane);
      m_hi = tg_sum(m_hi, scratch_f, sg, n_sg, lane);
      if (!count_mode && use_k && iter == 0) need_mass = p.top_p * m_in;  // [a, b) = the kept set

      if (c_in <= CAP) {
        // Every bracket entry is in cand_*: sort and read the threshold off.
        const uint size = pow2_ceil(max(c_in, 2u));
        for (uint i = c_in + tid; i < size; i += tpg) {
          cand_key[i] = 0u;
          cand_w[i] = 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        sort_desc(cand_key, cand_w, size, tid, tpg);
        if (count_mode) {
          answer = cand_key[need_count - base_count - 1];
        } else {
          const uint j = first_reaching(cand_w, c_in, base_mass, need_mass, 0.0f, scratch_f, scratch_u, tid, tpg,
                                        sg, n_sg, lane);
          answer = cand_key[min(j, c_in - 1)];
        }
        all_gathered = base_count == 0 && base_mass == 0.0f && b == kmax + 1;
        n_cand = c_in;
        break;
      }
      const bool mid_ok = count_mode ? base_count + c_hi >= need_count : base_mass + m_hi >= need_mass;
      if (mid_ok) {
        a = mid;
      } else {
        b = mid;
        base_count += c_hi;
        base_mass += m_hi;
      }
      answer = a;
    }
    tau = answer;
  }

  // A verify row's draft: its kept weight (0 outside the kept set or the vocabulary),
  // excluded from the draw below, which then samples p without it.
  const uint draft = row < p.drafts ? draft_ids[p.draft_pos + row] : NO_INDEX;
  float w_draft = 0.0f;
  if (draft < n) {
    const float v = lrow[draft];
    const uint k = is_nan(v) ? KEY_NEG_INF : key_of(v);
    const float w = exp((v - m) * inv_t);
    if (k >= tau && w >= p.min_p) w_draft = w;
  }

  // The draw: inverse CDF over the kept entries in index order. Thread t owns the
  // contiguous block [t*per, (t+1)*per); the block holding the target walks it again.
  const uint per = (n + tpg - 1) / tpg;
  const uint i0 = min(tid * per, n);
  const uint i1 = min(i0 + per, n);
  float s = 0.0f;
  uint last_pos = 0;  // 1 + last index with w > 0
  for (uint i = i0; i < i1; i++) {
    const float v = lrow[i];
    const uint k = is_nan(v) ? KEY_NEG_INF : key_of(v);
    if (k >= tau && i != draft) {
      const float w = exp((v - m) * inv_t);
      if (w < p.min_p) continue;
      s += w;
      if (w > 0.0f) last_pos = i + 1;
    }
  }
  float total;
  const float before = tg_exclusive_scan(s, scratch_f, sg, n_sg, lane, total);
  if (w_draft > 0.0f) {
    // Accept the draft with probability p(draft) = w_draft / (total + w_draft).
    const uint coin = philox4x32_10(uint4(p.counter + row, 1u, 0u, 0u), uint2(p.seed_lo, p.seed_hi));
    if ((float)(coin >> 8) * (1.0f / 16777216.0f) * (total + w_draft) < w_draft) {
      if (tid == 0) ids[p.out_pos + row] = draft;
      return;
    }
  }
  const uint bits = philox4x32_10(uint4(p.counter + row, 0u, 0u, 0u), uint2(p.seed_lo, p.seed_hi));
  const float target = (float)(bits >> 8) * (1.0f / 16777216.0f) * total;
  const bool mine = before + s > target && s > 0.0f;
  const uint first_thread = tg_min(mine ? tid : NO_INDEX, scratch_u, sg, n_sg, lane);
  const uint last = tg_max(last_pos, scratch_u, sg, n_sg, lane);
  if (first_thread == NO_INDEX) {
    // u * total rounded up to the total: the last entry with weight.
    if (tid == 0) ids[p.out_pos + row] = last > 0 ? last - 1 : argmax;
    return;
  }
  if (tid == first_thread) {
    float run = 0.0f;
    uint pick = i1 - 1;
    for (uint i = i0; i < i1; i++) {
      const float v = lrow[i];
      const uint k = is_nan(v) ? KEY_NEG_INF : key_of(v);
      if (k >= tau && i != draft) {
        const float w = exp((v - m) * inv_t);
        if (w < p.min_p) continue;
        run += w;
        if (before + run > target) {
          pick = i;
          break;
        }
      }
    }
    ids[p.out_pos + row] = pick;
  }
}

// Penalties, stage 1: count each token's occurrences in ids[start, end) (all of them in
// counts[0][t], the generated ones also in counts[1][t]).
//   ids uint [..]; counts atomic uint [2][n], all zero on entry (penalty_apply re-zeroes).
// Grid: end - start threads (any threadgroup size).
[[kernel]] void penalty_count(device const uint* ids [[buffer(0)]],
                              device atomic_uint* counts [[buffer(1)]],
                              constant PenaltyParams& p [[buffer(2)]],
                              uint gid [[thread_position_in_grid]]) {
  const uint pos = p.start + gid;
  if (pos >= p.end) return;
  const uint t = ids[pos];
  if (t >= p.n) return;  // never a vocabulary id: nothing to penalise
  atomic_fetch_add_explicit(&counts[t], 1u, memory_order_relaxed);
  if (pos >= p.generated_from) atomic_fetch_add_explicit(&counts[p.n + t], 1u, memory_order_relaxed);
}

// Penalties, stage 2: the penalised row (definition in params/sampling.h), counts back to 0.
//   logits [n] (one row); counts uint [2][n]; penalised [n] out.
// Grid: n threads (any threadgroup size).
[[kernel]] void penalty_apply(device const float* logits [[buffer(0)]],
                              device uint* counts [[buffer(1)]],
                              device float* penalised [[buffer(2)]],
                              constant PenaltyParams& p [[buffer(3)]],
                              uint i [[thread_position_in_grid]]) {
  if (i >= p.n) return;
  const uint seen = counts[i];
  const uint generated = counts[p.n + i];
  counts[i] = 0u;
  counts[p.n + i] = 0u;
  float l = logits[i];
  if (seen > 0u) l = l > 0.0f ? l / p.repetition : l * p.repetition;
  l -= p.frequency * (float)generated;
  l -= generated > 0u ? p.presence : 0.0f;
  penalised[i] = l;
}

// Greedy and sampled speculative verification alike (params/sampling.h): the accepted
// draft count and the next token, both left on the device.
//   ids uint [..] (drafts at draft_pos ..); chosen uint [drafts + 1]; accepted uint [1] out.
// Grid: 1 threadgroup of 1 thread.
[[kernel]] void spec_accept(device uint* ids [[buffer(0)]],
                            device const uint* chosen [[buffer(1)]],
                            device uint* accepted [[buffer(2)]],
                            constant SpecAcceptParams& p [[buffer(3)]],
                            uint tid [[thread_position_in_grid]]) {
  if (tid != 0) return;
  uint a = 0;
  while (a < p.drafts && chosen[a] == ids[p.draft_pos + a]) a++;
  ids[p.draft_pos + a] = chosen[a];
  accepted[0] = a;
}

// Log-probabilities of a chosen token and of the row's top entries, over the raw logits
// (definition and output layout in params/sampling.h). One pass: each thread keeps an
// online (max, sum of exp) and its own top_n list sorted descending (indices ascend within
// a thread, so a strict comparison keeps the lower id first among equals); then top_n
// rounds pick the best head of all threads' lists (ties: lower id), so nothing is sorted
// across the threadgroup and the threadgroup memory stays at two 32-entry scratches.
//   logits [n] (one row); ids uint [..], ids[out_pos] read; out uint [slots][ENTRY_WORDS].
// Grid: (1) threadgroup of 32..MQ_LOGPROB_THREADS threads (a multiple of 32).
[[max_total_threads_per_threadgroup(MQ_LOGPROB_THREADS)]]
[[kernel]] void token_logprobs(device const float* logits [[buffer(0)]],
                               device const uint* ids [[buffer(1)]],
                               device uint* out [[buffer(2)]],
                               constant LogprobParams& p [[buffer(3)]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint tpg [[threads_per_threadgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]],
                               uint n_sg [[simdgroups_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]]) {
  using namespace mq_sample;
  threadgroup float scratch_f[32];
  threadgroup uint scratch_u[32];
  uint top_key[MQ_LOGPROB_MAX_TOP];
  uint top_id[MQ_LOGPROB_MAX_TOP];
  uint held = 0;
  float my_m = -INFINITY;
  float my_s = 0.0f;
  for (uint i = tid; i < p.n; i += tpg) {
    const float v = logits[i];
    const bool nan_v = is_nan(v);
    if (!nan_v && v != -INFINITY) {
      if (v > my_m) {
        my_s = fma(my_s, exp(my_m - v), 1.0f);
        my_m = v;
      } else {
        my_s += exp(v - my_m);
      }
    }
    if (p.top_n == 0) continue;
    const uint k = nan_v ? KEY_NEG_INF : key_of(v);
    if (held == p.top_n && k <= top_key[held - 1]) continue;
    uint j = held < p.top_n ? held++ : p.top_n - 1;
    for (; j > 0 && top_key[j - 1] < k; j--) {
      top_key[j] = top_key[j - 1];
      top_id[j] = top_id[j - 1];
    }
    top_key[j] = k;
    top_id[j] = i;
  }
  const float m = value_of(tg_max(key_of(my_m), scratch_u, sg, n_sg, lane));
  const float s = tg_sum(my_s > 0.0f ? my_s * exp(my_m - m) : 0.0f, scratch_f, sg, n_sg, lane);
  const float lse = m + log(s);

  device uint* entry = out + (ulong)p.slot * MQ_LOGPROB_ENTRY_WORDS;
  if (tid == 0) {
    const uint chosen = ids[p.out_pos];
    const float v = chosen < p.n ? logits[chosen] : NAN;
    entry[0] = chosen;
    entry[1] = as_type<uint>(is_nan(v) ? -INFINITY : v - lse);
    entry[2] = as_type<uint>(lse);
    entry[3] = p.top_n;
  }
  uint head = 0;
  for (uint r = 0; r < p.top_n; r++) {
    const uint mine = head < held ? top_key[head] : 0u;  // 0: below every key, NaN's included
    const uint best = tg_max(mine, scratch_u, sg, n_sg, lane);
    const uint id = tg_min(head < held && mine == best ? top_id[head] : NO_INDEX, scratch_u, sg, n_sg, lane);
    if (head < held && top_id[head] == id) head++;
    if (tid == 0) {
      entry[4 + r] = id;
      entry[4 + MQ_LOGPROB_MAX_TOP + r] = as_type<uint>(value_of(best) - lse);
    }
  }
}

// A grammar's token mask applied to rows of logits (params/sampling.h): refused -> -inf.
//   logits [rows][row_stride] in place; mask uint [rows][mask_stride].
// Grid: >= (n, rows) threads.
[[kernel]] void token_mask(device float* logits [[buffer(0)]],
                           device const uint* mask [[buffer(1)]],
                           constant TokenMaskParams& p [[buffer(2)]],
                           uint2 gid [[thread_position_in_grid]]) {
  const uint t = gid.x;
  if (t >= p.n) return;
  const uint w = t / 32u;
  const bool allowed = w < p.mask_words && ((mask[(ulong)gid.y * p.mask_stride + w] >> (t % 32u)) & 1u) != 0u;
  if (!allowed) logits[(ulong)gid.y * p.row_stride + t] = -INFINITY;
}

// logit_bias (params/sampling.h): logits[row][token] += bias for each entry, on every row.
//   logits [rows][row_stride] in place; entries uint2 [MQ_LOGIT_BIAS_MAX].
// Grid: >= (MQ_LOGIT_BIAS_MAX, rows) threads.
[[kernel]] void logit_bias(device float* logits [[buffer(0)]],
                           device const uint2* entries [[buffer(1)]],
                           constant LogitBiasParams& p [[buffer(2)]],
                           uint2 gid [[thread_position_in_grid]]) {
  if (gid.x >= MQ_LOGIT_BIAS_MAX) return;
  const uint2 e = entries[gid.x];
  if (e.x >= p.n) return;
  logits[(ulong)gid.y * p.row_stride + e.x] += as_type<float>(e.y);
}
