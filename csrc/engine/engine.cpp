// Loading the engine (weights, caches, kernels), the slots' checks and committing steps.
#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "layer_tensors.h"
#include "dflash.h"  // Engine owns the DflashWeights and MtpWeights: its destructor needs the types
#include "mtp.h"

namespace mq::engine {
namespace {

void check_dims(const ModelDims& d) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw EngineError("[engine] unsupported model: " + what);
  };
  need(d.head_dim == MQ_ATTN_HEAD_DIM,
       "head_dim " + std::to_string(d.head_dim) + " (kernels need " + std::to_string(MQ_ATTN_HEAD_DIM) + ")");
  need(d.rotary_dim == MQ_ATTN_ROT_DIM,
       "rotary dims " + std::to_string(d.rotary_dim) + " (kernels need " + std::to_string(MQ_ATTN_ROT_DIM) + ")");
  need(d.lin_k_dim == MQ_DELTA_HEAD_DIM && d.lin_v_dim == MQ_DELTA_HEAD_DIM,
       "linear head dims " + std::to_string(d.lin_k_dim) + "/" + std::to_string(d.lin_v_dim) + " (kernels need " +
           std::to_string(MQ_DELTA_HEAD_DIM) + ")");
  need(d.heads % d.kv_heads == 0 && d.lin_v_heads % d.lin_k_heads == 0, "head counts must divide");
  need(d.hidden % 32 == 0 && d.intermediate % 4 == 0, "hidden size must be a multiple of 32");
  if (d.experts > 0) {
    need(d.experts <= MQ_MOE_MAX_EXPERTS, std::to_string(d.experts) + " experts (the router kernel takes up to " +
                                              std::to_string(MQ_MOE_MAX_EXPERTS) + ")");
    need(d.experts_per_token >= 1 && d.experts_per_token <= std::min(d.experts, MQ_MOE_MAX_TOP_K),
         std::to_string(d.experts_per_token) + " experts per token (1 .. min(experts, " +
             std::to_string(MQ_MOE_MAX_TOP_K) + "))");
    need(d.moe_intermediate % 4 == 0 && d.shared_intermediate % 4 == 0 && d.shared_intermediate > 0,
         "MoE intermediate sizes must be positive multiples of 4");
  }
}

}  // namespace

Engine::Engine(std::shared_ptr<gpu::Device> device, ModelDesc model, EngineOptions options,
               const LoadProgress& progress)
    : device_(std::move(device)),
      model_(keep_layer_range(std::move(model), options)),
      options_(options),
      range_(layer_range(model_.dims, options)),
      memory_(check_memory_fits(*device_, model_, options_)),
      weights_(*device_, model_, progress.weights) {
  check_dims(model_.dims);
  if (options_.kv_bits != 8 && options_.kv_bits != 16)
    throw EngineError("[engine] kv_bits must be 8 (q8 cache) or 16 (f16 cache), got " +
                      std::to_string(options_.kv_bits));
  if (options_.max_context < 1) throw EngineError("[engine] max_context must be positive");
  if (options_.prefill_chunk < 1) throw EngineError("[engine] prefill_chunk must be positive");
  if (options_.prefill_layers_per_buffer < 1) throw EngineError("[engine] prefill_layers_per_buffer must be positive");
  if (options_.max_draft < 0 || options_.max_draft >= MQ_QMV_MAX_ROWS)
    throw EngineError("[engine] max_draft must be in 0.." + std::to_string(MQ_QMV_MAX_ROWS - 1) +
                      " (a verify step holds at most " + std::to_string(MQ_QMV_MAX_ROWS) + " rows), got " +
                      std::to_string(options_.max_draft));
  layers_ = load_layers(weights_, model_.dims, range_);
  if (embeds() || (has_head() && (model_.dims.tied || options_.mtp)))
    embed_ = weights_.linear("language_model.model.embed_tokens");
  if (has_head()) {
    lm_head_ = model_.dims.tied ? embed_ : weights_.linear("language_model.lm_head");
    final_norm_ = weights_.tensor("language_model.model.norm.weight");
  }
  if (options_.mtp) load_mtp();
  if (options_.max_sequences < 1 || options_.max_sequences > MQ_MAX_SEGMENTS)
    throw EngineError("[engine] max_sequences must be in 1.." + std::to_string(MQ_MAX_SEGMENTS) +
                      " (one step holds at most " + std::to_string(MQ_MAX_SEGMENTS) + " sequences), got " +
                      std::to_string(options_.max_sequences));
  sequences_.resize(size_t(options_.max_sequences));
  ws_ = std::make_unique<Workspace>(*device_, model_.dims, options_, layers_);
  if (model_.drafter.layers > 0) load_dflash();
  counters_.weight_bytes_per_token = decode_weight_bytes(weights_, layers_, model_.dims, range_);
  counters_.weight_bytes = memory_.weights;
  counters_.weight_bytes_copied = weights_.copied_bytes();
  counters_.weight_buffers = weights_.buffer_count();
  counters_.load_rss_before = weights_.rss_before();
  counters_.load_peak_rss = weights_.peak_rss();
  counters_.memory_estimate = memory_.total();
  KernelPlan plan;
  plan_kernels(plan);
  kernels_.create(*device_, plan.needs(), progress.kernels);
  counters_.library_kernels = kernels_.library_kernels();
  counters_.library_source_bytes = kernels_.library_source_bytes();
  plan.resolve(kernels_);
  for (int slot = 0; slot < options_.max_sequences; ++slot) reset(slot);
}

Engine::~Engine() = default;

void Engine::set_chosen(int slot, uint32_t id) {
  const Sequence& q = sequence(slot, "set_chosen: ");
  if (id >= uint32_t(model_.dims.vocab))
    throw EngineError("[engine] set_chosen: token id " + std::to_string(id) + " is outside the vocabulary");
  if (q.position >= options_.max_context)
    throw ContextFull("[engine] set_chosen: slot " + std::to_string(slot) + " is full");
  host_ids(slot)[q.position] = id;
}

float* Engine::residual_rows() const { return static_cast<float*>(ws_->x->contents()); }

uint32_t Engine::max_rows() const { return ws_->max_rows; }

uint32_t Engine::max_step_rows() const { return engine::max_step_rows(options_); }

void Engine::check_whole(const std::string& what) const {
  if (!range_.whole(model_.dims))
    throw EngineError("[engine] " + what + " needs the whole model; this engine runs layers [" +
                      std::to_string(range_.first) + ", " + std::to_string(range_.end) + ") of " +
                      std::to_string(model_.dims.layers));
}

ForwardPass ForwardPass::one_slot(int slot, int position, uint32_t rows, bool matvec) {
  ForwardPass pass;
  pass.segs.count = 1;
  pass.segs.seg[0] = {.slot = uint32_t(slot), .first_row = 0, .rows = rows, .position = uint32_t(position)};
  pass.rows = rows;
  pass.matvec = matvec;
  return pass;
}

const Engine::Sequence& Engine::sequence(int slot, const std::string& caller) const {
  if (slot < 0 || slot >= options_.max_sequences)
    throw EngineError("[engine] " + caller + "slot " + std::to_string(slot) + " is outside 0.." +
                      std::to_string(options_.max_sequences - 1) + " (max_sequences, set at load)");
  return sequences_[size_t(slot)];
}

Engine::Sequence& Engine::sequence(int slot, const std::string& caller) {
  return const_cast<Sequence&>(std::as_const(*this).sequence(slot, caller));
}

void Engine::check_room(size_t extra, const Sequence& q, const std::string& caller) const {
  if (size_t(q.position) + extra > size_t(options_.max_context))
    throw ContextFull("[engine] " + caller + "context full: " + std::to_string(q.position) + " tokens + " +
                      std::to_string(extra) + " exceed max_context " + std::to_string(options_.max_context));
}

void Engine::check_sampling(const Sampling& s) const {
  if (s.logprobs < -1 || s.logprobs > MQ_LOGPROB_MAX_TOP)
    throw EngineError("[engine] logprobs must be -1 (off) or 0.." + std::to_string(MQ_LOGPROB_MAX_TOP) + ", got " +
                      std::to_string(s.logprobs));
  if (s.logit_bias.size() > MQ_LOGIT_BIAS_MAX)
    throw EngineError("[engine] logit_bias takes at most " + std::to_string(MQ_LOGIT_BIAS_MAX) + " tokens, got " +
                      std::to_string(s.logit_bias.size()));
  std::vector<uint32_t> ids;
  for (const auto& [id, bias] : s.logit_bias) {
    if (id >= uint32_t(model_.dims.vocab))
      throw EngineError("[engine] logit_bias token id " + std::to_string(id) + " is outside the vocabulary");
    if (!std::isfinite(bias))
      throw EngineError("[engine] logit_bias of token " + std::to_string(id) + " is not a finite number");
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end())
    throw EngineError("[engine] logit_bias names a token id twice");
}

Submitted Engine::commit(Encoder& enc) {
  counters_.steps += 1;
  counters_.dispatches += enc.dispatches();
  counters_.last_step_dispatches = enc.dispatches();
  counters_.barriers += enc.barriers();
  counters_.last_step_barriers = enc.barriers();
  counters_.host_encode_us += enc.encoding_time().count();
  counters_.last_step_host_encode_us = enc.encoding_time().count();
  Submitted step = enc.finish();
  counters_.command_buffers += step.size();
  return step;
}

void Engine::wait(Submitted& step) {
  counters_.cpu_waits += 1;
  for (auto& cb : step) cb->wait();
}

void Engine::drain(Submitted& step) {
  for (auto& cb : step) {
    try {
      cb->wait();
    } catch (const gpu::GpuError&) {
      // Failing behind the step whose error is being reported (Metal ignores such buffers).
    }
  }
}

void Engine::commit_and_wait(Encoder& enc, const std::string& kind, int slot) {
  Submitted step = commit(enc);
  try {
    wait(step);
  } catch (const gpu::GpuError& e) {
    throw step_failed(kind, {slot}, e);
  }
}

gpu::GpuError Engine::step_failed(const std::string& kind, const std::vector<int>& slots, const gpu::GpuError& cause) {
  // The steps queued behind the failed one fail with it (or ran on a state it left half-written).
  std::vector<int> reset = slots;
  for (InFlight& step : in_flight_) {
    drain(step.buffers);
    for (int slot : step.slots())
      if (std::find(reset.begin(), reset.end(), slot) == reset.end()) reset.push_back(slot);
  }
  in_flight_.clear();
  decoding_.reset();
  std::string names;
  for (int slot : reset) {
    ws_->clear_state(slot);
    sequences_[size_t(slot)] = Sequence{};
    names += (names.empty() ? "" : ", ") + std::to_string(slot);
  }
  // A step stopped between penalty_count and penalty_apply leaves counts that must be zero.
  std::memset(ws_->penalty_counts->contents(), 0, ws_->penalty_counts->size());
  counters_.failed_steps += 1;
  return gpu::GpuError("[engine] " + kind + " failed on the GPU; slot" + (reset.size() > 1 ? "s " : " ") + names +
                       " reset to an empty sequence: " + cause.what());
}

}  // namespace mq::engine
