// What one dispatch of a forward-pass kernel must move and compute, from its name and its
// parameter struct (shaders/params/*.h): the ideal each kernel is measured against.
#pragma once
#include <string>

#include "engine/kernels.h"

namespace mq::bench {

struct DispatchCost {
  std::string shape;  // the sizes that matter, e.g. "1024x3584" or "ctx 4096"
  double bytes = 0;   // device memory read + written, each byte once; 0 when not modelled
  double flops = 0;
};

// Kernels outside the model (none in a decode step) get {"", 0, 0}.
DispatchCost dispatch_cost(const engine::RecordedDispatch& d);

}  // namespace mq::bench
