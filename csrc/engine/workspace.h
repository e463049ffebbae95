// Engine internals: the per-layer weights and every device buffer a step uses.
// Activation buffers hold up to `max_rows` token rows; f32 unless stated.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "../../shaders/params.h"
#include "engine.h"

namespace mq::engine {

// Steps of up to max_step_rows(options) rows (decode, verify, shared) take the matvec and
// flash-decode path; longer ones the GEMM and prefill-attention path. MQ_QMV_SMALL_ROWS unless
// max_draft asks for more (up to MQ_QMV_MAX_ROWS: the deep verify tier, shaders/params/quant.h).
uint32_t max_step_rows(const EngineOptions& options);
// silu_mul takes any threadgroup shape; one float4 per thread.
constexpr uint32_t kSiluMulThreads = 64;
// residual_add (engines without the head) likewise.
constexpr uint32_t kResidualAddThreads = 64;
// copy_u32 (state snapshots) takes any threadgroup shape; one word per thread.
constexpr uint32_t kCopyThreads = 256;
// logit_bias takes any threadgroup shape; one table entry per thread.
constexpr uint32_t kLogitBiasThreads = 64;
// moe_gather_rows and moe_combine take any threadgroup shape; one float4 per thread.
constexpr uint32_t kMoeRowThreads = 64;

// A buffer holding one equal part per sequence slot, slot-major: slot s at s * slot_bytes.
struct SlotBuffer {
  std::shared_ptr<gpu::Buffer> buffer;
  size_t slot_bytes = 0;  // a multiple of kSlotAlign
  Arg part(int slot) const { return Arg(buffer, size_t(slot) * slot_bytes); }
  void* host(int slot) const { return static_cast<char*>(buffer->contents()) + size_t(slot) * slot_bytes; }
};
// Slot parts start 256-byte aligned: any kernel may bind one at its offset (float4 and wider).
constexpr size_t kSlotAlign = 256;
// A SlotBuffer of `slots` parts of at least `bytes` each.
SlotBuffer new_slot_buffer(gpu::Device& device, size_t bytes, int slots);

// Vectors are bf16 or f32 (pipelines.cpp picks the kernel variant); f16 ones arrive widened to f32 (weights.h).
struct AttentionWeights {
  QuantLinear q_proj, k_proj, v_proj, o_proj;  // q_proj rows per head: [query | gate]
  DeviceTensor q_norm, k_norm;                 // [head_dim], stored as 1 + w; one dtype
};

struct DeltaNetWeights {
  QuantLinear in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  DeviceTensor conv1d;   // [C][K][1]
  DeviceTensor dt_bias;  // [nv], the dtype of conv1d
  DeviceTensor a_log;    // f32 or bf16 [nv]
  DeviceTensor norm;     // [dv], not shifted
};

// down(silu(gate(x)) * up(x)): the dense MLP, and the shared expert of a MoE block.
struct MlpWeights {
  QuantLinear gate_proj, up_proj, down_proj;
};

// Qwen3.5-MoE sparse block (names as mlx-lm's): a standalone unit so that an MTP head
// with a MoE MLP can reuse it.
struct MoeWeights {
  QuantLinear gate;                            // router [experts][hidden] (8-bit in mlx-lm conversions)
  QuantLinear gate_proj, up_proj, down_proj;   // switch_mlp: stacked [experts][out][in]
  MlpWeights shared_expert;
  QuantLinear shared_expert_gate;              // [1][hidden]
};

// The pipelines of a layer's kernels that read its vectors (norm weights, conv, A_log: their
// variants follow those dtypes), resolved at load (Engine::plan_kernels).
struct LayerKernels {
  const Pipeline *input_norm = nullptr, *input_norm_residual = nullptr, *post_norm_residual = nullptr;
  const Pipeline *conv_scan = nullptr, *norm_history = nullptr;                      // DeltaNet
  const Pipeline *attn_prep = nullptr, *attn_prefill = nullptr;                      // attention, prefill
  const Pipeline *attn_decode_r1 = nullptr, *attn_decode_r4 = nullptr;               // attention, matvec path
};

struct LayerWeights {
  bool full_attention = false;
  LayerKernels kernels;
  DeviceTensor input_norm, post_norm;  // [hidden], stored as 1 + w
  std::optional<AttentionWeights> attn;
  std::optional<DeltaNetWeights> delta;
  std::optional<MlpWeights> mlp;  // dense models
  std::optional<MoeWeights> moe;  // MoE models
  // Recurrent state (DeltaNet) or KV cache (attention) of this layer, per sequence slot.
  SlotBuffer state, hist;  // [slots][nv][D][D]; ring [slots][history_slots][C] (params/deltanet.h)
  SlotBuffer k_cache, v_cache;  // [slots][the cache layout of params/attention.h]
  // Speculative rollback (DeltaNet, options.max_draft > 0): the state after each of the
  // first max_draft rows of a verify step, [slots][max_draft][nv][D][D]; the history ring needs none.
  SlotBuffer state_snaps;
};

// Distances between sequence slots in the per-layer SlotBuffers, as the kernels take them
// (params/common.h: slot-major, one buffer per layer): each slot's part, kSlotAlign-aligned.
struct SlotStrides {
  uint32_t state_words;     // DeltaNet state [nv][D][D]
  uint32_t history_words;   // conv history ring [history_slots][C]
  uint32_t snapshot_words;  // state snapshot planes [max_draft][nv][D][D]
  uint32_t cache_bytes;     // one K (or V) cache, kv_cache_slot_bytes
};

struct Workspace {
  // Allocates the activations, and each layer's cache or recurrent state into `layers`; declares
  // them all resident (Device::make_resident).
  Workspace(gpu::Device& device, const ModelDims& dims, const EngineOptions& options,
            std::vector<LayerWeights>& layers);
  // Zeroes `slot`'s DeltaNet states and conv history rings.
  void clear_state(int slot);

  uint32_t max_rows;                         // rows per step: max(prefill_chunk, verify rows)
  uint32_t max_splits;                       // most decode attention context splits (sizes part_o, part_ms)
  SlotStrides slot_strides;                  // checked at construction (slot_strides())
  SlotBuffer ids;                            // uint [slots][max_context + 1]: token at each position
  std::shared_ptr<gpu::Buffer> x, xn, mix;   // [rows][hidden]: residual, normed, mixer/MLP out
  // [rows][hidden]: where a norm-fused matvec writes x + mix (its threadgroups all read x), swapped
  // with x once encoded: x always names the residual stream at that point of the step.
  std::shared_ptr<gpu::Buffer> x_next;
  // [max_step_rows + rows][hidden]: a shared step's rows on an engine of a layer range with several
  // slots (Engine::step_rows: the entries' rows, then the prompt chunk's); 16 bytes otherwise.
  std::shared_ptr<gpu::Buffer> step_rows;
  std::shared_ptr<gpu::Buffer> qkv_raw;      // [rows][C]: in_proj_qkv out (the conv input)
  std::shared_ptr<gpu::Buffer> z, a, b;      // [rows][nv*dv], [rows][nv], [rows][nv]
  std::shared_ptr<gpu::Buffer> delta_out;    // [rows][nv*dv]: the scan's gated y (prefill: normalised in place)
  std::shared_ptr<gpu::Buffer> head_ss;      // [rows][nv][MQ_DELTA_HEAD_PARTIALS]: the scan's sums of y^2
  std::shared_ptr<gpu::Buffer> q, k, v;      // [rows][nq*2*HD], [rows][nkv*HD] x2
  std::shared_ptr<gpu::Buffer> attn;         // [rows][nq*HD]
  // Decode splits: [step rows][nq][splits][HD], float2 [step rows][nq][splits] (max_step_rows).
  std::shared_ptr<gpu::Buffer> part_o, part_ms;
  std::shared_ptr<gpu::Buffer> gate, up, act;    // [rows][I]: dense MLP or shared expert (mlp_intermediate)
  // MoE (pairs = rows * experts_per_token, see shaders/params/moe.h):
  std::shared_ptr<gpu::Buffer> router_logits;    // [rows][experts]
  std::shared_ptr<gpu::Buffer> shared_gate;      // [rows]: shared_expert_gate logit
  std::shared_ptr<gpu::Buffer> route_ids;        // uint [pairs]: chosen experts
  std::shared_ptr<gpu::Buffer> route_weights;    // [pairs]
  std::shared_ptr<gpu::Buffer> expert_offsets;   // uint [experts + 1] (prefill grouping)
  std::shared_ptr<gpu::Buffer> expert_order, expert_slot;  // uint [pairs] (prefill grouping)
  std::shared_ptr<gpu::Buffer> expert_x;         // [pairs][hidden]: grouped input rows (prefill)
  std::shared_ptr<gpu::Buffer> expert_gate, expert_up, expert_act;  // [pairs][moe_intermediate]
  std::shared_ptr<gpu::Buffer> expert_out;       // [pairs][hidden]
  std::shared_ptr<gpu::Buffer> logits;       // [rows][vocab]
  std::shared_ptr<gpu::Buffer> partials;     // uint2 [rows][n_partials]: argmax stage 1
  std::shared_ptr<gpu::Buffer> penalty_counts;  // uint [2][vocab], zero between steps (params/sampling.h)
  std::shared_ptr<gpu::Buffer> penalised;       // [vocab]: the chosen row's logits after penalties
  std::shared_ptr<gpu::Buffer> biased;          // [vocab]: the chosen row's logits plus its logit_bias
  // uint [slots][ceil(vocab / 32)], rows back to back: each slot's grammar mask, host-written
  // (Engine::token_masks; params/sampling.h token_mask).
  std::shared_ptr<gpu::Buffer> token_masks;
  // MTP head (allocated with EngineOptions::mtp, else 16 bytes each):
  std::shared_ptr<gpu::Buffer> mtp_in;       // [rows][2 hidden]: [pre_fc_norm_embedding(e) | pre_fc_norm_hidden(h)]
  std::shared_ptr<gpu::Buffer> mtp_hidden;   // [rows][hidden]: after mtp.norm (the next chained step's h)
  // [slots][hidden]: each slot's mtp_hidden row for the pair that predicted ids[position + 1]
  // (Sequence::mtp_carry), copied out of the step that ran the head: the next step's drafts start there.
  SlotBuffer mtp_carry;
  SlotBuffer logprobs;  // uint [slots][MQ_LOGPROB_SLOTS][MQ_LOGPROB_ENTRY_WORDS] (params/sampling.h)
  SlotBuffer logit_bias;  // uint2 [slots][MQ_LOGIT_BIAS_MAX]: (token id, bias bits), unused ids >= vocab
  std::shared_ptr<gpu::Buffer> rope_turns;   // uint64 [ROT/2]
  std::shared_ptr<gpu::Buffer> no_snapshots; // bound where snapshot planes are unused
  std::shared_ptr<gpu::Buffer> verify_chosen;  // uint [max_step_rows]: a verify step's choice per row
  std::shared_ptr<gpu::Buffer>
      accepted;       // uint [MQ_MAX_SEGMENTS]: drafts each segment of the last verify step accepted
  std::vector<SlotBuffer> recurrent;  // every state/hist buffer, for clearing
  uint32_t argmax_chunk, argmax_partials;
};

// Floats of one DeltaNet layer's recurrent state [nv][D][D] and conv history ring
// [history_slots][C]: K-1 positions read by a step plus the most a verify step writes
// (max_step_rows), so a rejected draft's rows never overwrite a position the next step reads.
size_t state_words(const ModelDims& dims);
uint32_t history_slots(const ModelDims& dims, const EngineOptions& options);
size_t history_words(const ModelDims& dims, const EngineOptions& options);
inline Arg at(const DeviceTensor& t) { return Arg(t.buffer, t.offset); }
// The weight, scales and biases slots of a projection kernel (buffers 0..2); formats
// without scales or biases get the weight bound there (never read).
inline Arg scales_of(const QuantLinear& l) { return at(l.scales.buffer ? l.scales : l.weight); }
inline Arg biases_of(const QuantLinear& l) { return at(l.biases.buffer ? l.biases : l.weight); }

// Flash-decode splits for one sequence's `context` positions when one split takes `groups`
// threadgroups (kv heads x head blocks: the head groups only, not the row groups): splits
// of >= 128 positions, enough of them to give each of the GPU's cores a few threadgroups, at
// most max_splits (Workspace::max_splits). It depends on the sequence alone, never on the
// step's rows or the other sequences sharing the step, so a sequence's attention gives the
// same bits whether it decodes alone or batched (a split layout changes the f32 sums).
uint32_t decode_splits(uint32_t context, uint32_t groups, uint32_t gpu_cores, uint32_t max_splits);
// Rows per SIMD-group R of the decode/verify matvec variant streaming `weight_rows` weight rows
// (a norm-fused group: all its members'; gate + up: both): the largest of 8, 4 whose grid gives
// each of the GPU's cores MQ_QMV_THREADGROUPS_PER_CORE threadgroups, else 2 (shaders/params/quant.h).
uint32_t qmv_rows_per_simdgroup(uint64_t weight_rows, uint32_t gpu_cores);
// The per-slot strides for these dims and options; throws EngineError when one is not a
// multiple of 16 bytes (the kernels' float4 access) or does not fit the kernels' uint.
SlotStrides slot_strides(const ModelDims& dims, const EngineOptions& options);
// Bytes of one attention layer's K (or V) cache at max_context, and of its part per slot (aligned).
size_t kv_cache_bytes(const ModelDims& dims, const EngineOptions& options);
size_t kv_cache_slot_bytes(const ModelDims& dims, const EngineOptions& options);
// Bytes of the rest Workspace allocates: activations, and per slot the ids and every DeltaNet layer's state.
uint64_t workspace_bytes(const ModelDims& dims, const EngineOptions& options);
// Workspace::max_rows for these options: a multiple of 8 (prefill attention reads q in 8-row tiles).
uint32_t rows_per_step(const EngineOptions& options);
// Intermediate size of the buffers gate/up/act: the dense MLP's, or the shared expert's.
uint32_t mlp_intermediate(const ModelDims& dims);

}  // namespace mq::engine
