// The model shapes metalqwen_bench times: real Qwen3.5 sizes (no checkpoint needed) and a
// tiny one for tests.
#pragma once
#include <string>
#include <vector>

#include "engine/model_desc.h"

namespace mq::bench {

struct BenchShape {
  std::string name;
  std::string note;  // where the sizes come from, or what the shape is for
  engine::ModelDims dims;
};

// 0.8B, 9B, 27B, 35B-A3B, then "tiny" (the test checkpoints' size: not a real model).
std::vector<BenchShape> bench_shapes();

}  // namespace mq::bench
