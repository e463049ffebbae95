// The Qwen3.5 engine: weights and caches on the device, one command buffer per
// step (prefill chunk | decode | verify), token ids kept on the GPU.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"
#include "gpu/device.h"
#include "kernels.h"
#include "memory_budget.h"
#include "model_desc.h"
#include "weights.h"

namespace mq::engine {

struct Counters {
  uint64_t steps = 0;            // command buffers committed
  uint64_t dispatches = 0;       // over all steps
  uint64_t last_step_dispatches = 0;
  uint64_t barriers = 0;         // dependent dispatch boundaries, over all steps (Encoder::barriers)
  uint64_t last_step_barriers = 0;
  double host_encode_us = 0;     // host time encoding steps (Encoder::encoding_time), over all steps
  double last_step_host_encode_us = 0;
  uint64_t cpu_waits = 0;        // CommandBuffer::wait calls
  uint64_t tokens_decoded = 0;   // decode steps
  uint64_t max_steps_in_flight = 0;  // decode steps committed and not yet waited for (2 = pipelined)
  uint64_t weight_bytes_per_token = 0;  // weights a decode step streams
  uint64_t weight_bytes_copied = 0;     // at load, where the file could not be wrapped
  uint64_t weight_buffers = 0;          // device buffers holding the weights (shards split at max_buffer_length)
  uint64_t memory_estimate = 0;         // bytes the load was admitted with (weights + KV cache + workspace)
};

// How the next token is chosen on the GPU: penalties (when not neutral) on the logits,
// then greedy argmax at temperature 0, else temperature -> top-k -> top-p -> min-p and a
// seeded draw (shaders/sampling.metal). Neutral values dispatch nothing extra.
struct Sampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;    // over the tokens generated since the last prefill
  float frequency_penalty = 0.0f;   // likewise, times each token's count
  float repetition_penalty = 1.0f;  // over the whole context (prompt + generated)
  uint64_t seed = 0;
  bool penalised() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f; }
};

struct LayerWeights;
struct MlpWeights;
struct MoeWeights;
struct Workspace;

// The state after the first `position` tokens, saved aside: every DeltaNet state and
// conv history, and the attention K/V rows [0, position). Restoring it resumes exactly
// that sequence, whatever ran since (see snapshot.cpp).
struct Snapshot {
  const void* engine = nullptr;        // the engine that took it: only that one restores it
  int position = 0;
  std::vector<uint32_t> tokens;        // ids [0, position)
  std::shared_ptr<gpu::Buffer> data;   // the state regions back to back, in Engine::state_regions order
  size_t nbytes() const { return data ? data->size() : 0; }
};

// Load progress: weights placed (bytes), then kernels built (see Kernels::Progress).
struct LoadProgress {
  Weights::Progress weights;
  Kernels::Progress kernels;
};

// Called after each prefill chunk is committed with (tokens submitted, tokens in all); an
// exception it throws (e.g. an interrupt) stops the prefill after the chunks submitted.
using PrefillProgress = std::function<void(size_t done, size_t total)>;

class Engine {
 public:
  Engine(std::shared_ptr<gpu::Device> device, ModelDesc model, EngineOptions options,
         const LoadProgress& progress = {});
  ~Engine();

  // Forgets every token: position 0, caches and recurrent state cleared.
  void reset();
  int position() const { return position_; }
  int max_context() const { return options_.max_context; }
  const ModelDims& dims() const { return model_.dims; }

  // Runs `tokens` from the current position in prefill chunks, then chooses the next
  // token on the GPU (ids[position]). Returns logits [tokens.size()][vocab] when
  // `all_logits`, else the last row's logits when `last_logits`, else nothing. Throws
  // ContextFull (before running anything) when the tokens and the chosen one do not fit.
  // When `progress` throws, the chunks already submitted stay fed (position() tells).
  // `snapshot_at`: absolute positions in (position(), position() + tokens.size()], ascending,
  // after which the state is saved into `snapshots` by the chunk that ends there.
  std::vector<float> prefill(const std::vector<uint32_t>& tokens, const Sampling& sampling, bool all_logits,
                             bool last_logits, const PrefillProgress& progress = {},
                             const std::vector<int>& snapshot_at = {},
                             std::vector<std::shared_ptr<Snapshot>>* snapshots = nullptr);
  // Puts a snapshot's state back: position() and tokens() become the snapshot's.
  void restore(const Snapshot& snapshot);

  // Token-by-token decoding from the token prefill chose: decode_begin, then
  // decode_next until it returns nothing (after max_tokens) or the caller stops,
  // then decode_end. Step k+1 is committed before step k is waited for (its input id
  // is read on the GPU), so the GPU never waits for the CPU. After decode_end the state
  // holds every returned token but possibly the last (tokens() tells).
  void decode_begin(int max_tokens, const Sampling& sampling);
  std::optional<uint32_t> decode_next();
  void decode_end();

  // Token ids fed so far (positions 0 .. position()-1).
  std::vector<uint32_t> tokens() const;
  const Counters& counters() const { return counters_; }
  // The model's pipelines (bench/ records a step's dispatches through them).
  Kernels& kernels() { return kernels_; }

 private:
  // Every kernel encode_step may dispatch for this model, with its threadgroup needs.
  std::map<std::string, ThreadgroupNeed> kernel_needs() const;
  void check_room(size_t extra) const;
  // Encodes the model over `rows` tokens at position_ (ids[position_ ..]): logits of
  // rows [logit_row0, rows) into the logits buffer and, with `choose`, the next token
  // (from the last row) into ids[position_ + rows]. A `prefill` step always takes the
  // GEMM / prefill-attention path, whose per-row results do not depend on the other rows
  // of the chunk: so a prompt resumed from a snapshot gets a cold run's logits exactly.
  // Decode and verify steps of up to kMaxVerifyRows rows take the matvec path.
  void encode_step(Encoder& enc, uint32_t rows, uint32_t logit_row0, const Sampling* choose, bool prefill);
  void encode_layer(Encoder& enc, const LayerWeights& layer, uint32_t rows);
  // The MLP on xn into mix: dense, or the sparse MoE block (routing stays on the GPU).
  void encode_mlp(Encoder& enc, const MlpWeights& mlp, uint32_t rows, uint32_t intermediate);
  void encode_moe_mlp(Encoder& enc, const MoeWeights& moe, uint32_t rows);
  void encode_projection(Encoder& enc, const QuantLinear& l, const Arg& x, uint32_t x_stride, const Arg& y,
                         uint32_t y_stride, uint32_t rows, bool overlap = false);
  void encode_norm(Encoder& enc, const DeviceTensor& weight, uint32_t rows, bool add_residual,
                   const std::shared_ptr<gpu::Buffer>& residual);
  void encode_choice(Encoder& enc, uint32_t logit_row, const Sampling& sampling, uint32_t out_pos);
  // Where the state after `position` tokens lives: (buffer, byte offset, bytes) regions.
  struct StateRegion {
    std::shared_ptr<gpu::Buffer> buffer;
    size_t offset, bytes;
  };
  std::vector<StateRegion> state_regions(int position) const;
  // Copies the state after `position` tokens (what `enc` leaves) into a new snapshot.
  std::shared_ptr<Snapshot> encode_snapshot(Encoder& enc, int position);
  std::unique_ptr<gpu::CommandBuffer> commit(Encoder& enc);
  void wait(gpu::CommandBuffer& cb);

  std::shared_ptr<gpu::Device> device_;
  ModelDesc model_;
  EngineOptions options_;
  MemoryNeeds memory_;  // checked before weights_ loads anything
  Weights weights_;
  Kernels kernels_;
  std::vector<LayerWeights> layers_;
  QuantLinear embed_, lm_head_;  // lm_head_ is embed_ when the embeddings are tied
  DeviceTensor final_norm_;
  std::unique_ptr<Workspace> ws_;
  bool matvec_ = false;  // the step being encoded takes the matvec / flash-decode path
  int position_ = 0;
  int generated_from_ = 0;  // end of the last prefill: positions from here on were generated
  Counters counters_;

  struct Decoding {
    Sampling sampling;
    int max_tokens = 0, returned = 0, committed = 0;
    std::deque<std::pair<std::unique_ptr<gpu::CommandBuffer>, int>> in_flight;  // (step, id slot it writes)
  };
  std::optional<Decoding> decoding_;
  void commit_decode_step();
};

}  // namespace mq::engine
