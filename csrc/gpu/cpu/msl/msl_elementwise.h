// Lifts scalar functions to vectors: MQ_ELEMENTWISE(name) adds the overload of `name`
// that takes any mix of one vector type and scalars, as MSL allows (fma(float4, float, float4)).
#pragma once
#include "msl_vector.h"

namespace metal {

// The vector type of an argument list: the first vector argument's, as vec.
template <class... A>
struct mq_vec_of {
  using type = void;
};
template <class A, class... R>
struct mq_vec_of<A, R...> {
  using type = conditional_t<(mq_shape<A>::n > 0), vec<typename mq_shape<A>::elem, mq_shape<A>::n>,
                             typename mq_vec_of<R...>::type>;
};

template <class T, class A>
constexpr T mq_element(A a, int i) {
  if constexpr (mq_shape<A>::n > 0)
    return a.e[i];
  else
    return T(a);
}

// Every vector argument must be of the one vector type; scalars convert to its element type.
template <class F, class... A>
constexpr auto mq_map(F f, A... a) {
  using V = typename mq_vec_of<A...>::type;
  using T = typename mq_shape<V>::elem;
  constexpr int N = mq_shape<V>::n;
  static_assert(((mq_shape<A>::n == 0 || __is_same(typename mq_vec_of<A>::type, V)) && ...),
                "vector arguments of an MSL function must have the same type");
  using R = decltype(f(mq_element<T>(a, 0)...));
  vec<R, N> r;
  for (int i = 0; i < N; i++) r.e[i] = f(mq_element<T>(a, i)...);
  return r;
}

}  // namespace metal

// Declare after every scalar overload of `name`: the lambda's call binds to the
// overloads visible here (scalars have no associated namespace for ADL to add).
#define MQ_ELEMENTWISE(name)                                                   \
  template <class... A>                                                        \
    requires(mq_vector<A> || ...)                                              \
  constexpr auto name(A... a) {                                                 \
    return mq_map([](auto... x) { return name(x...); }, a...);                 \
  }
