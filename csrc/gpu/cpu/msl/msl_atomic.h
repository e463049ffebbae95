// MSL atomics on device and threadgroup memory. Threadgroups run concurrently on
// several OS threads, so these are real atomic instructions on the object's storage;
// the checking variant leaves them uninstrumented (MQ_UNCHECKED): atomics never race.
#pragma once
#include "msl_sync.h"
#include "msl_traits.h"

namespace metal {

// Same size and alignment as T, so kernels may cast device buffers to atomic_uint*.
template <class T>
struct atomic {
  T mq_value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

template <class T>
using mq_operand_t = typename remove_cv<T>::type;  // keeps the operand from deducing T
template <class T>
MQ_UNCHECKED T* mq_storage(volatile atomic<T>* object) {
  return const_cast<T*>(&object->mq_value);
}

template <class T>
MQ_UNCHECKED void atomic_store_explicit(volatile atomic<T>* object, mq_operand_t<T> desired, memory_order order) {
  __atomic_store(mq_storage(object), &desired, int(order));
}
template <class T>
MQ_UNCHECKED T atomic_load_explicit(volatile atomic<T>* object, memory_order order) {
  T value;
  __atomic_load(mq_storage(object), &value, int(order));
  return value;
}
template <class T>
MQ_UNCHECKED T atomic_exchange_explicit(volatile atomic<T>* object, mq_operand_t<T> desired, memory_order order) {
  T old;
  __atomic_exchange(mq_storage(object), &desired, &old, int(order));
  return old;
}
// Implemented strong (never fails spuriously), which a weak exchange is allowed to be.
template <class T>
MQ_UNCHECKED bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* object, T* expected,
                                                        mq_operand_t<T> desired, memory_order success,
                                                        memory_order failure) {
  return __atomic_compare_exchange(mq_storage(object), expected, &desired, false, int(success), int(failure));
}

// Read-modify-write by compare-exchange loop, for what has no native instruction
// (float arithmetic, min and max).
template <class T, class F>
MQ_UNCHECKED T mq_atomic_update(volatile atomic<T>* object, memory_order order, F update) {
  T old = atomic_load_explicit(object, memory_order_relaxed);
  for (;;) {
    T desired = update(old);
    if (__atomic_compare_exchange(mq_storage(object), &old, &desired, true, int(order), __ATOMIC_RELAXED)) return old;
  }
}

// Integers use the native instruction where there is one; everything else the loop.
#define MQ_ATOMIC_FETCH(name, expr, native_integer)                                         \
  template <class T>                                                                        \
  MQ_UNCHECKED T atomic_fetch_##name##_explicit(volatile atomic<T>* object,                \
                                                mq_operand_t<T> operand, memory_order order) { \
    if constexpr (mq_integer<T>) {                                                          \
      native_integer                                                                        \
    }                                                                                       \
    return mq_atomic_update(object, order, [operand](T old) { return T(expr); });           \
  }
#define MQ_NATIVE(builtin) return builtin(mq_storage(object), operand, int(order));
MQ_ATOMIC_FETCH(add, old + operand, MQ_NATIVE(__atomic_fetch_add))
MQ_ATOMIC_FETCH(sub, old - operand, MQ_NATIVE(__atomic_fetch_sub))
MQ_ATOMIC_FETCH(and, old & operand, MQ_NATIVE(__atomic_fetch_and))
MQ_ATOMIC_FETCH(or, old | operand, MQ_NATIVE(__atomic_fetch_or))
MQ_ATOMIC_FETCH(xor, old ^ operand, MQ_NATIVE(__atomic_fetch_xor))
MQ_ATOMIC_FETCH(min, operand < old ? operand : old, )
MQ_ATOMIC_FETCH(max, operand > old ? operand : old, )
#undef MQ_NATIVE
#undef MQ_ATOMIC_FETCH

}  // namespace metal

using metal::atomic_bool;
using metal::atomic_float;
using metal::atomic_int;
using metal::atomic_long;
using metal::atomic_uint;
using metal::atomic_ulong;
