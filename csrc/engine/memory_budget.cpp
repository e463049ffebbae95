#include "memory_budget.h"

#include <cstdio>
#include <string>

#include "dflash.h"

namespace mq::engine {
namespace {

std::string human(uint64_t bytes) {
  char text[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(1ull << 30));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(1ull << 20));
  }
  return text;
}

// The largest max_context whose estimate fits `limit` (0 if none does): the estimate
// grows linearly with max_context, so one step of 1024 tokens gives the slope.
int64_t largest_fitting_context(const ModelDesc& model, EngineOptions options, uint64_t limit) {
  options.max_context = 2;
  const uint64_t base = estimate_memory(model, options).total();
  options.max_context += 1024;
  const double per_token = double(estimate_memory(model, options).total() - base) / 1024.0;
  if (base > limit) return 0;
  return 2 + int64_t(double(limit - base) / per_token);
}

}  // namespace

MemoryNeeds estimate_memory(const ModelDesc& model, const EngineOptions& options) {
  MemoryNeeds needs;
  needs.weights = options.beside_weight_bytes;
  for (const auto& entry : model.tensors) needs.weights += placed_bytes(entry.second);
  uint64_t attention_layers = options.mtp ? 1 : 0;  // the MTP head's layer keeps its own cache
  const LayerRange range = layer_range(model.dims, options);
  for (int i = range.first; i < range.end; ++i) attention_layers += model.dims.full_attention[size_t(i)];
  needs.kv_cache = 2 * attention_layers * kv_cache_slot_bytes(model.dims, options) * uint64_t(options.max_sequences);
  needs.workspace = workspace_bytes(model.dims, options);
  if (model.drafter.layers > 0) {  // its weights are among the tensors
    needs.kv_cache += dflash_cache_bytes(model.drafter, options);
    needs.workspace += dflash_workspace_bytes(model.drafter, options);
  }
  return needs;
}

MemoryNeeds check_memory_fits(const gpu::Device& device, const ModelDesc& model, const EngineOptions& options) {
  const MemoryNeeds needs = estimate_memory(model, options);
  const uint64_t limit = device.recommended_working_set();
  if (needs.total() <= limit) return needs;
  std::string message = "[engine] the model does not fit in GPU memory: it needs " + human(needs.total()) + " (" +
                        std::to_string(needs.total()) + " bytes: weights " + human(needs.weights) + " + KV cache " +
                        human(needs.kv_cache) + " at max_context " + std::to_string(options.max_context) +
                        (options.max_sequences > 1 ? " for " + std::to_string(options.max_sequences) + " sequences"
                                                   : "") +
                        " + workspace " + human(needs.workspace) + "), but " + device.name() + " may use " +
                        human(limit) + " (" + std::to_string(limit) + " bytes, its recommended working set). ";
  const int64_t context = largest_fitting_context(model, options, limit);
  if (context >= 2) {
    message += "Lower max_context (up to " + std::to_string(context) + " fits)";
    if (options.max_sequences > 1) message += " or max_sequences";
    if (options.kv_bits != 8) message += " or use kv_bits=8 (the q8 KV cache, about half the size of f16)";
    message += ", or load a smaller model or one quantized to fewer bits.";
  } else {
    message +=
        "Even the weights and workspace do not fit at the smallest max_context: load a smaller model or one "
        "quantized to fewer bits (a smaller prefill_chunk shrinks the workspace a little).";
  }
  throw gpu::GpuError(message);
}

}  // namespace mq::engine
