// metalqwen_bench's results, and the two ways it prints them: a table and JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gpu/apple_chips.h"

namespace mq::bench {

// One distinct dispatch of a decode step (kernel, sizes), timed alone.
struct KernelResult {
  std::string kernel, sizes;
  int per_step = 0;              // times a step encodes it
  double us_per_dispatch = 0;    // median over the repeats
  double bytes = 0, flops = 0;   // per dispatch (cost_model.h); 0 when not modelled
};

// A whole decode step, committed token after token as generation does.
struct StepResult {
  double us_per_token = 0;       // wall time per step over the timed tokens
  double bytes_per_token = 0;    // the sum of the step's dispatches' bytes
  uint64_t weight_bytes_per_token = 0;
  uint64_t dispatches = 0, barriers = 0;
  double host_encode_us = 0;     // the last step's
};

struct ShapeResult {
  std::string shape, note;
  std::string error;             // why the shape could not run here (e.g. too large), else empty
  int context = 0;               // positions in the cache when the step runs
  std::vector<KernelResult> kernels;
  std::optional<StepResult> step;  // absent when the filter leaves it out
};

struct Report {
  std::string device_kind, device_name;
  gpu::AppleChip chip;
  double peak_gbs = 0;           // 0: unknown (no % of peak, no share of the limit)
  bool quick = false;
  int repeats = 0, dispatches = 0, tokens = 0;
  std::vector<ShapeResult> shapes;
};

void print_table(const Report& report, std::ostream& out);
void print_json(const Report& report, std::ostream& out);

}  // namespace mq::bench
