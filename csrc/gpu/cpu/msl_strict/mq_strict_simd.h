// Synchronisation, SIMD-group, simdgroup-matrix and atomic functions of MSL for the
// strict check; those taking pointers are declared once per address space they accept.
#pragma once

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8, mem_object_data = 16 };
constexpr mem_flags operator|(mem_flags, mem_flags);
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

// SIMD-group (32 lanes) and quad-group (4 lanes) collectives over a scalar or vector of a lane.
#define MQ_STRICT_GROUP(G)                                                                                   \
  template <class T> mq_if_arith<T> G##_sum(T);                                                             \
  template <class T> mq_if_arith<T> G##_product(T);                                                         \
  template <class T> mq_if_arith<T> G##_min(T);                                                             \
  template <class T> mq_if_arith<T> G##_max(T);                                                             \
  template <class T> mq_if_arith<T> G##_and(T);                                                             \
  template <class T> mq_if_arith<T> G##_or(T);                                                              \
  template <class T> mq_if_arith<T> G##_xor(T);                                                             \
  template <class T> mq_if_arith<T> G##_prefix_inclusive_sum(T);                                           \
  template <class T> mq_if_arith<T> G##_prefix_exclusive_sum(T);                                           \
  template <class T> mq_if_arith<T> G##_prefix_inclusive_product(T);                                       \
  template <class T> mq_if_arith<T> G##_prefix_exclusive_product(T);                                       \
  template <class T> mq_if_arith<T> G##_shuffle(T, ushort);                                                 \
  template <class T> mq_if_arith<T> G##_broadcast(T, ushort);                                               \
  template <class T> mq_if_arith<T> G##_shuffle_xor(T, ushort);                                             \
  template <class T> mq_if_arith<T> G##_shuffle_up(T, ushort);                                              \
  template <class T> mq_if_arith<T> G##_shuffle_down(T, ushort);                                            \
  template <class T> mq_if_arith<T> G##_shuffle_rotate_up(T, ushort);                                       \
  template <class T> mq_if_arith<T> G##_shuffle_rotate_down(T, ushort);                                     \
  bool G##_all(bool);                                                                                        \
  bool G##_any(bool);
MQ_STRICT_GROUP(simd)
MQ_STRICT_GROUP(quad)
#undef MQ_STRICT_GROUP
template <class T> mq_if_arith<T> simd_broadcast_first(T);
template <class T> mq_if_arith<T> simd_shuffle_and_fill_down(T, T, ushort, ushort modulo = 32);
template <class T> mq_if_arith<T> simd_shuffle_and_fill_up(T, T, ushort, ushort modulo = 32);
bool simd_is_first();
bool simd_is_helper_thread();
class simd_vote {
 public:
  typedef ulong vote_t;
  explicit simd_vote(vote_t v = 0);
  explicit operator vote_t() const;
  explicit operator bool() const;
  bool all() const;
  bool any() const;
};
simd_vote simd_ballot(bool);
simd_vote simd_active_threads_mask();

// 8x8 matrices spread over a SIMD-group.
template <class T> struct mq_pair_of;
template <> struct mq_pair_of<float> { typedef float2 type; };
template <> struct mq_pair_of<half> { typedef half2 type; };
template <> struct mq_pair_of<bfloat> { typedef bfloat2 type; };
template <class T, int Cols, int Rows> struct simdgroup_matrix {
  simdgroup_matrix() = default;
  explicit simdgroup_matrix(T);
  thread typename mq_pair_of<T>::type& thread_elements();  // this lane's two elements
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <class T, int Cols, int Rows = Cols> simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T);
#define MQ_STRICT_MATRIX_MEMORY(AS)                                                                          \
  template <class T, int C, int R>                                                                           \
  void simdgroup_load(thread simdgroup_matrix<T, C, R>&, const AS T*, ulong elements_per_row = C,           \
                      ulong2 matrix_origin = 0, bool transpose_matrix = false);                             \
  template <class T, int C, int R>                                                                           \
  void simdgroup_store(simdgroup_matrix<T, C, R>, AS T*, ulong elements_per_row = C, ulong2 matrix_origin = 0, \
                       bool transpose_matrix = false);
MQ_STRICT_MATRIX_MEMORY(device)
MQ_STRICT_MATRIX_MEMORY(threadgroup)
#undef MQ_STRICT_MATRIX_MEMORY
template <class T, class A, class B, int C, int R, int K>
void simdgroup_multiply(thread simdgroup_matrix<T, C, R>&, const thread simdgroup_matrix<A, K, R>&,
                        const thread simdgroup_matrix<B, C, K>&);
template <class T, class A, class B, class D, int C, int R, int K>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<D, C, R>&, const thread simdgroup_matrix<A, K, R>&,
                                   const thread simdgroup_matrix<B, C, K>&, const thread simdgroup_matrix<T, C, R>&);

// Atomics live in device or threadgroup memory only; the value converts to the atomic's type.
template <class T> struct mq_same { typedef T type; };
template <class T> using mq_same_t = typename mq_same<T>::type;
enum memory_order { memory_order_relaxed, memory_order_acquire, memory_order_release, memory_order_acq_rel, memory_order_seq_cst };
template <class T> struct _atomic {
  _atomic() = default;
  _atomic(const _atomic&) = delete;
  _atomic& operator=(const _atomic&) = delete;
};
template <class T> using atomic = _atomic<T>;
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
typedef _atomic<bool> atomic_bool;
typedef _atomic<float> atomic_float;
#define MQ_STRICT_ATOMICS(AS)                                                                                 \
  template <class T> T atomic_load_explicit(const AS _atomic<T>*, memory_order);                              \
  template <class T> void atomic_store_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                             \
  template <class T> T atomic_exchange_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                             \
  template <class T>                                                                                           \
  bool atomic_compare_exchange_weak_explicit(AS _atomic<T>*, thread mq_same_t<T>*, mq_same_t<T>, memory_order, memory_order);       \
  template <class T> T atomic_fetch_add_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                            \
  template <class T> T atomic_fetch_sub_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                            \
  template <class T> T atomic_fetch_min_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                            \
  template <class T> T atomic_fetch_max_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                            \
  template <class T> T atomic_fetch_and_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                            \
  template <class T> T atomic_fetch_or_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);                             \
  template <class T> T atomic_fetch_xor_explicit(AS _atomic<T>*, mq_same_t<T>, memory_order);
MQ_STRICT_ATOMICS(device)
MQ_STRICT_ATOMICS(threadgroup)
#undef MQ_STRICT_ATOMICS
}  // namespace metal
