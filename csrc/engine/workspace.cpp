#include "workspace.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mq::engine {

uint32_t mlp_intermediate(const ModelDims& d) {
  return uint32_t(d.experts > 0 ? d.shared_intermediate : d.intermediate);
}

uint32_t rows_per_step(const EngineOptions& o) {
  return (std::max(uint32_t(o.prefill_chunk), max_step_rows(o)) + 7) / 8 * 8;
}

namespace {

// Flash-decode splits: at least kMinSplitLen positions each (up to that, one split and no
// combine), about kSplitThreadgroupsPerCore threadgroups per GPU core over all splits, and at
// most kMaxSplits (the combine reads nq * splits partials per row: it stays a small pass).
// The partials are sized for kMaxSplits whatever max_context is, so the workspace does not
// grow in steps with it (largest_fitting_context solves a linear need).
constexpr uint32_t kMinSplitLen = 128;
constexpr uint32_t kSplitThreadgroupsPerCore = 4;
constexpr uint32_t kMaxSplits = 64;
constexpr uint32_t kArgmaxChunk = 4096;  // logits per stage-1 argmax threadgroup: ~61 of them for a 248320 vocabulary

using Slot = std::shared_ptr<gpu::Buffer> Workspace::*;
struct Planned {
  Slot slot;
  size_t words;  // 4-byte words (f32 or uint)
};

// Every activation buffer of the workspace with its size; the constructor allocates
// them and workspace_bytes counts them, so the two cannot drift apart.
std::vector<Planned> activation_plan(const ModelDims& d, const EngineOptions& o) {
  const size_t R = rows_per_step(o), H = size_t(d.hidden), D = MQ_DELTA_HEAD_DIM, HD = MQ_ATTN_HEAD_DIM;
  const size_t nv = size_t(d.lin_v_heads), C = size_t(2 * d.lin_k_heads) * D + nv * D;
  const size_t nq = size_t(d.heads), nkv = size_t(d.kv_heads), I = mlp_intermediate(d), V = size_t(d.vocab);
  const size_t E = size_t(d.experts), P = R * size_t(d.experts_per_token), MI = size_t(d.moe_intermediate);
  const size_t partials = (V + kArgmaxChunk - 1) / kArgmaxChunk, S = max_step_rows(o);
  return {
      {&Workspace::x, R * H},
      {&Workspace::x_next, R * H},
      {&Workspace::step_rows, o.max_sequences > 1 && !layer_range(d, o).whole(d) ? (S + R) * H : 0},
      {&Workspace::xn, R * H},
      {&Workspace::mix, R * H},
      {&Workspace::qkv_raw, R * C},
      {&Workspace::z, R * nv * D},
      {&Workspace::a, R * nv},
      {&Workspace::b, R * nv},
      {&Workspace::delta_out, R * nv * D},
      {&Workspace::head_ss, R * nv * MQ_DELTA_HEAD_PARTIALS},
      {&Workspace::q, R * nq * 2 * HD},
      {&Workspace::k, R * nkv * HD},
      {&Workspace::v, R * nkv * HD},
      {&Workspace::attn, R * nq * HD},
      {&Workspace::part_o, S * nq * kMaxSplits * HD},
      {&Workspace::part_ms, S * nq * kMaxSplits * 2},
      {&Workspace::gate, R * I},
      {&Workspace::up, R * I},
      {&Workspace::act, R * I},
      {&Workspace::router_logits, R * E},
      {&Workspace::shared_gate, R},
      {&Workspace::route_ids, P},
      {&Workspace::route_weights, P},
      {&Workspace::expert_offsets, E + 1},
      {&Workspace::expert_order, P},
      {&Workspace::expert_slot, P},
      {&Workspace::expert_x, P * H},
      {&Workspace::expert_gate, P * MI},
      {&Workspace::expert_up, P * MI},
      {&Workspace::expert_act, P * MI},
      {&Workspace::expert_out, P * H},
      {&Workspace::logits, R * V},
      {&Workspace::partials, R * partials * 2},
      {&Workspace::penalty_counts, 2 * V},
      {&Workspace::penalised, V},
      {&Workspace::biased, V},
      {&Workspace::token_masks, size_t(o.max_sequences) * ((V + 31) / 32)},
      {&Workspace::mtp_in, o.mtp ? R * 2 * H : 0},
      {&Workspace::mtp_hidden, o.mtp ? R * H : 0},
      {&Workspace::rope_turns, MQ_ATTN_ROT_DIM},  // uint64 [ROT/2]
      {&Workspace::no_snapshots, 4},
      {&Workspace::verify_chosen, S},
      {&Workspace::accepted, MQ_MAX_SEGMENTS},
  };
}

size_t bytes_of_words(size_t words) { return std::max<size_t>(words, 4) * 4; }
size_t slot_part_bytes(size_t bytes) { return (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

// Every per-slot buffer of the workspace with its words per slot (slot-major SlotBuffers): the
// token ids, the logprob ring, the logit_bias table and the MTP carry, then per DeltaNet layer
// its state, ring and rollback planes.
using SlotSlot = SlotBuffer Workspace::*;
std::vector<std::pair<SlotSlot, size_t>> slot_plan(const ModelDims& d, const EngineOptions& o) {
  return {{&Workspace::ids, size_t(o.max_context) + 1},
          {&Workspace::logprobs, MQ_LOGPROB_SLOTS * MQ_LOGPROB_ENTRY_WORDS},
          {&Workspace::logit_bias, 2 * MQ_LOGIT_BIAS_MAX},
          {&Workspace::mtp_carry, o.mtp ? size_t(d.hidden) : 0}};
}
std::vector<size_t> delta_layer_slot_words(const ModelDims& d, const EngineOptions& o) {
  std::vector<size_t> words{state_words(d), history_words(d, o)};
  if (o.max_draft > 0) words.push_back(size_t(o.max_draft) * state_words(d));
  return words;
}

}  // namespace

uint32_t max_step_rows(const EngineOptions& o) {
  return o.max_draft + 1 > MQ_QMV_SMALL_ROWS ? MQ_QMV_MAX_ROWS : MQ_QMV_SMALL_ROWS;
}

size_t state_words(const ModelDims& d) { return size_t(d.lin_v_heads) * MQ_DELTA_HEAD_DIM * MQ_DELTA_HEAD_DIM; }
uint32_t history_slots(const ModelDims& d, const EngineOptions& o) {
  return uint32_t(d.conv_kernel - 1) + max_step_rows(o);
}
size_t history_words(const ModelDims& d, const EngineOptions& o) {
  const size_t C = size_t(2 * d.lin_k_heads + d.lin_v_heads) * MQ_DELTA_HEAD_DIM;
  return history_slots(d, o) * C;
}

uint32_t decode_splits(uint32_t context, uint32_t groups, uint32_t gpu_cores, uint32_t max_splits) {
  const uint32_t by_length = (context + kMinSplitLen - 1) / kMinSplitLen;
  const uint32_t by_cores = (gpu_cores * kSplitThreadgroupsPerCore + groups - 1) / groups;
  return std::max(1u, std::min({by_length, by_cores, max_splits}));
}

SlotStrides slot_strides(const ModelDims& d, const EngineOptions& o) {
  // The parts new_slot_buffer gives each slot (kSlotAlign-aligned), in the units the kernels take.
  auto fits = [](const char* what, size_t value) {
    if (value > UINT32_MAX)
      throw EngineError(std::string("[engine] the per-slot ") + what + " stride " + std::to_string(value) +
                        " does not fit the kernels' 32-bit strides (lower max_context)");
    return uint32_t(value);
  };
  auto words = [](size_t n) { return slot_part_bytes(bytes_of_words(n)) / 4; };
  return {.state_words = fits("DeltaNet state", words(state_words(d))),
          .history_words = fits("conv history", words(history_words(d, o))),
          .snapshot_words = fits("state snapshot", o.max_draft > 0 ? words(size_t(o.max_draft) * state_words(d)) : 0),
          .cache_bytes = fits("KV cache", kv_cache_slot_bytes(d, o))};
}

size_t kv_cache_bytes(const ModelDims& d, const EngineOptions& o) {
  const size_t kv_dim = size_t(d.kv_heads) * MQ_ATTN_HEAD_DIM, ctx = size_t(o.max_context);
  return o.kv_bits == 8 ? ctx * kv_dim + ctx * kv_dim / MQ_ATTN_Q8_BLOCK * 2 : ctx * kv_dim * 2;
}

SlotBuffer new_slot_buffer(gpu::Device& device, size_t bytes, int slots) {
  const size_t part = slot_part_bytes(bytes);
  return {.buffer = device.new_buffer(part * size_t(slots)), .slot_bytes = part};
}

uint64_t workspace_bytes(const ModelDims& d, const EngineOptions& o) {
  uint64_t total = 0, per_slot = 0;
  for (const Planned& p : activation_plan(d, o)) total += bytes_of_words(p.words);
  for (const auto& planned : slot_plan(d, o)) per_slot += slot_part_bytes(bytes_of_words(planned.second));
  const LayerRange range = layer_range(d, o);
  for (int i = range.first; i < range.end; ++i)
    if (!d.full_attention[size_t(i)])
      for (size_t words : delta_layer_slot_words(d, o)) per_slot += slot_part_bytes(bytes_of_words(words));
  return total + per_slot * uint64_t(o.max_sequences);
}

size_t kv_cache_slot_bytes(const ModelDims& d, const EngineOptions& o) { return slot_part_bytes(kv_cache_bytes(d, o)); }

Workspace::Workspace(gpu::Device& device, const ModelDims& d, const EngineOptions& o,
                     std::vector<LayerWeights>& layers) {
  max_rows = rows_per_step(o);
  max_splits = kMaxSplits;
  slot_strides = engine::slot_strides(d, o);
  argmax_chunk = kArgmaxChunk;
  argmax_partials = uint32_t((size_t(d.vocab) + argmax_chunk - 1) / argmax_chunk);
  std::vector<std::shared_ptr<gpu::Buffer>> made;  // every buffer below, declared resident at the end
  auto words = [&](size_t n) { return made.emplace_back(device.new_buffer(bytes_of_words(n))); };
  auto slot_bytes = [&](size_t bytes) {
    SlotBuffer b = new_slot_buffer(device, bytes, o.max_sequences);
    made.push_back(b.buffer);
    return b;
  };
  auto slot_words = [&](size_t n) { return slot_bytes(bytes_of_words(n)); };
  for (const Planned& p : activation_plan(d, o)) this->*p.slot = words(p.words);
  for (const auto& planned : slot_plan(d, o)) this->*planned.first = slot_words(planned.second);
  std::memset(penalty_counts->contents(), 0, penalty_counts->size());  // penalty_apply keeps it zero

  // rope_turns[i] = round(2^64 * theta^(-2i/rot) / (2 pi)) mod 2^64 (see params/attention.h).
  auto* turns = static_cast<uint64_t*>(rope_turns->contents());
  for (int i = 0; i < MQ_ATTN_ROT_DIM / 2; ++i) {
    long double inv_freq = std::pow((long double)d.rope_theta, -2.0L * i / MQ_ATTN_ROT_DIM);
    long double t = inv_freq / (2.0L * 3.14159265358979323846264338327950288L) * 18446744073709551616.0L;
    t = std::fmod(std::round(t), 18446744073709551616.0L);
    turns[i] = uint64_t(t);
  }

  for (LayerWeights& l : layers) {
    if (l.full_attention) {
      l.k_cache = slot_bytes(kv_cache_bytes(d, o));
      l.v_cache = slot_bytes(kv_cache_bytes(d, o));
    } else {
      l.state = slot_words(state_words(d));
      l.hist = slot_words(history_words(d, o));
      recurrent.push_back(l.state);
      recurrent.push_back(l.hist);
      if (o.max_draft > 0) l.state_snaps = slot_words(size_t(o.max_draft) * state_words(d));
    }
  }
  device.make_resident(made);
}

void Workspace::clear_state(int slot) {
  for (const SlotBuffer& b : recurrent) std::memset(b.host(slot), 0, b.slot_bytes);
}

}  // namespace mq::engine
