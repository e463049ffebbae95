// What a model needs on the GPU, checked before anything is loaded against what the
// device may use, so a model that does not fit is refused with a clear message
// instead of failing in its first command buffer.
#pragma once
#include <cstdint>

#include "gpu/device.h"
#include "model_desc.h"

namespace mq::engine {

struct MemoryNeeds {
  uint64_t weights = 0;  // every tensor the engine holds (its layer range's: keep_layer_range), and those beside it
  uint64_t kv_cache = 0;  // K and V caches of the attention layers (and the MTP layer's) at max_context
  uint64_t workspace = 0;  // activations and DeltaNet state
  uint64_t total() const { return weights + kv_cache + workspace; }
};

MemoryNeeds estimate_memory(const ModelDesc& model, const EngineOptions& options);

// The estimate, or GpuError "[engine] ..." when it exceeds the device's recommended
// working set: how much is needed, how much the GPU may use, which options lower it.
MemoryNeeds check_memory_fits(const gpu::Device& device, const ModelDesc& model, const EngineOptions& options);

}  // namespace mq::engine
