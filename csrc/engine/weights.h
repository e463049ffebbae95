// Checkpoint tensors on the device: safetensors files are memory-mapped and handed
// to the GPU without a copy where a tensor's offset allows (16-byte aligned, the
// kernels' vector loads). The other tensors of a shard (MLX writes its headers unpadded,
// so usually all of them) are read with pread, in runs of file-contiguous tensors, straight
// into a few arena buffers per shard at 16-byte aligned offsets, never through the mapping:
// the load's memory stays close to the weights' size. F16 tensors other than unquantized
// matrices (norms, conv, dt_bias, A_log, scales, biases) are widened to F32 in the arenas:
// those kernels read bf16 (as stored) or f32. Wrapped spans and arenas are at most the
// device's max_buffer_length, split at tensor boundaries: each tensor lies entirely inside
// one buffer. Every weight buffer is read-only to the GPU and declared resident.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../shaders/params.h"
#include "gpu/device.h"
#include "model_desc.h"

namespace mq::engine {

struct DeviceTensor {
  std::shared_ptr<gpu::Buffer> buffer;
  size_t offset = 0;
  const TensorDesc* desc = nullptr;
};

struct Pipeline;

// A decode/verify matvec family's variant for one projection (or norm-fused group), by a step's
// activation rows: the one-row and small verify tier's pipelines (up to MQ_QMV_SMALL_ROWS rows)
// at rows per SIMD-group R = r, chosen from the shape at load (Engine::plan_kernels,
// qmv_rows_per_simdgroup), and in engines whose steps go deeper the deep tier's (up to
// MQ_QMV_MAX_ROWS rows, R = MQ_QMV_DEEP_R; shaders/params/quant.h).
struct QmvVariant {
  const Pipeline *one = nullptr, *rows = nullptr, *deep = nullptr;
  uint32_t r = 0;
  bool is_deep(uint32_t activation_rows) const { return activation_rows > MQ_QMV_SMALL_ROWS; }
  const Pipeline& pipeline(uint32_t activation_rows) const {
    return activation_rows == 1 ? *one : is_deep(activation_rows) ? *deep : *rows;
  }
  // Threadgroups over `weight_rows` rows at `activation_rows`: the grid of every matvec dispatch.
  uint32_t threadgroups(uint32_t weight_rows, uint32_t activation_rows) const {
    const uint32_t per_threadgroup = MQ_QMV_SIMDGROUPS * (is_deep(activation_rows) ? MQ_QMV_DEEP_R : r);
    return (weight_rows + per_threadgroup - 1) / per_threadgroup;
  }
};

// The pipelines of a projection's format that the model's steps use (Engine::plan_kernels);
// null for the others.
struct ProjectionKernels {
  QmvVariant qmv;                                          // y = W x: 1 row, verify rows (two tiers)
  QmvVariant qmv_norm;                                     // norm-fused (shaders/qmv_norm.metal), R per group
  QmvVariant qmv_norm_silu;                                // gate_proj's: gate, up and silu
  QmvVariant qmv_head_norm;                                // DeltaNet out_proj's: the gated norm's factor folded in
  const Pipeline* qmm = nullptr;                           // prefill
  const Pipeline *moe_qmv = nullptr, *moe_qmm = nullptr;  // a stack of experts
  const Pipeline* moe_qmv_route_silu = nullptr;           // the experts' gate_proj's: routing, gate, up and silu
  const Pipeline* moe_qmv_combine = nullptr;              // the experts' down_proj's: down and the weighted sum
  const Pipeline* embed = nullptr;                         // the embedding table
};

// A linear layer (or embedding table): y = W x with W [out][in] in one of the weight
// formats of shaders/quant_formats.h; or, with experts > 0, a stack of them
// [experts][out][in] (MoE switch_mlp). Formats without scales or biases leave those
// tensors empty (no buffer).
struct QuantLinear {
  DeviceTensor weight, scales, biases;
  std::string format;  // kernel-name suffix: b<bits>_g<group>, mxfp4, nvfp4, mxfp8, bf16, f16, f32
  uint32_t in = 0, out = 0;
  uint32_t experts = 0;
  ProjectionKernels kernels;
  uint64_t nbytes() const {
    return weight.desc->nbytes + (scales.desc ? scales.desc->nbytes : 0) + (biases.desc ? biases.desc->nbytes : 0);
  }
  // Bytes of one matrix of the stack (all of them when not stacked).
  uint64_t expert_nbytes() const { return nbytes() / (experts ? experts : 1); }
};

// True for the tensors Weights places as F32 copies: F16 vectors and scales, and tensors
// shifted at load (TensorDesc::add).
bool widened_on_load(const TensorDesc& t);
// Device bytes of a tensor: its file bytes, or those of its F32 copy.
uint64_t placed_bytes(const TensorDesc& t);

class Weights {
 public:
  // `progress(done, total)` is called as tensors are placed (bytes).
  using Progress = std::function<void(uint64_t done, uint64_t total)>;
  Weights(gpu::Device& device, const ModelDesc& model, const Progress& progress = {});
  // Throws std::runtime_error naming the tensor when it is absent.
  DeviceTensor tensor(const std::string& name) const;
  QuantLinear linear(const std::string& module) const;
  // Bytes placed in arenas (read or widened) because a tensor's offset did not allow wrapping the file.
  uint64_t copied_bytes() const { return copied_bytes_; }
  // Device buffers the tensors live in (wrapped file spans and arenas).
  size_t buffer_count() const { return buffers_.size(); }
  // The process's resident set size (process_memory.h) before the first tensor was placed, and
  // the largest of the samples taken after each read or widened chunk (at most kReadChunk bytes)
  // and each wrapped span: the load's peak, up to what one chunk adds between two samples.
  uint64_t rss_before() const { return rss_before_; }
  uint64_t peak_rss() const { return peak_rss_; }

  static constexpr uint64_t kReadChunk = uint64_t(16) << 20;

 private:
  struct ShardFile;
  using Entry = std::pair<const std::string, TensorDesc>;
  // A tensor's place in an arena (Weights::place_arenas).
  struct ArenaSlot {
    const Entry* entry;
    size_t arena;
    uint64_t offset;
  };
  void place_file(gpu::Device& device, const std::string& path, std::vector<const Entry*> entries,
                  const std::function<void(uint64_t bytes)>& placed);
  void place_arenas(gpu::Device& device, const ShardFile& file, const std::vector<const Entry*>& entries,
                    const std::function<void(uint64_t bytes)>& placed);
  void read_run(const ShardFile& file, uint64_t offset, uint64_t bytes, char* dst,
                const std::function<void(uint64_t bytes)>& placed);
  void widen(const ShardFile& file, const Entry& entry, float* dst, const std::function<void(uint64_t bytes)>& placed);
  void sample_rss();

  std::map<std::string, TensorDesc> widened_;  // descriptions of the F32 copies of F16 tensors

  std::map<std::string, DeviceTensor> tensors_;
  std::vector<std::shared_ptr<gpu::Buffer>> buffers_;  // wrapped spans and arenas
  uint64_t copied_bytes_ = 0;
  uint64_t rss_before_ = 0, peak_rss_ = 0;
};

}  // namespace mq::engine
