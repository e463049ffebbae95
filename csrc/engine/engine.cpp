#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <stdexcept>

#include "mtp.h"  // Engine owns the MtpWeights: its destructor needs the type
#include "workspace.h"

namespace mq::engine {
namespace {

void check_dims(const ModelDims& d) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw EngineError("[engine] unsupported model: " + what);
  };
  need(d.head_dim == MQ_ATTN_HEAD_DIM, "head_dim " + std::to_string(d.head_dim) + " (kernels need " +
                                           std::to_string(MQ_ATTN_HEAD_DIM) + ")");
  need(d.rotary_dim == MQ_ATTN_ROT_DIM, "rotary dims " + std::to_string(d.rotary_dim) + " (kernels need " +
                                            std::to_string(MQ_ATTN_ROT_DIM) + ")");
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
      model_(std::move(model)),
      options_(options),
      memory_(check_memory_fits(*device_, model_, options_)),
      weights_(*device_, model_, progress.weights) {
  check_dims(model_.dims);
  if (options_.kv_bits != 8 && options_.kv_bits != 16)
    throw EngineError("[engine] kv_bits must be 8 (q8 cache) or 16 (f16 cache), got " +
                             std::to_string(options_.kv_bits));
  if (options_.max_context < 1) throw EngineError("[engine] max_context must be positive");
  if (options_.prefill_chunk < 1) throw EngineError("[engine] prefill_chunk must be positive");
  if (options_.prefill_layers_per_buffer < 1) throw EngineError("[engine] prefill_layers_per_buffer must be positive");
  if (options_.max_draft < 0 || options_.max_draft >= int(kMaxVerifyRows))
    throw EngineError("[engine] max_draft must be in 0.." + std::to_string(kMaxVerifyRows - 1) +
                      " (a verify step holds at most " + std::to_string(kMaxVerifyRows) + " rows), got " +
                      std::to_string(options_.max_draft));
  layers_ = load_layers(weights_, model_.dims);
  embed_ = weights_.linear("language_model.model.embed_tokens");
  lm_head_ = model_.dims.tied ? embed_ : weights_.linear("language_model.lm_head");
  final_norm_ = weights_.tensor("language_model.model.norm.weight");
  if (options_.mtp) load_mtp();
  if (options_.max_sequences < 1 || options_.max_sequences > MQ_MAX_SEGMENTS)
    throw EngineError("[engine] max_sequences must be in 1.." + std::to_string(MQ_MAX_SEGMENTS) +
                      " (one step holds at most " + std::to_string(MQ_MAX_SEGMENTS) + " sequences), got " +
                      std::to_string(options_.max_sequences));
  sequences_.resize(size_t(options_.max_sequences));
  seq_ = &sequences_[0];
  ws_ = std::make_unique<Workspace>(*device_, model_.dims, options_, layers_);
  counters_.weight_bytes_per_token = decode_weight_bytes(weights_, layers_, model_.dims);
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
  reset();
}

Engine::~Engine() = default;

void Engine::check_slot(int slot, const std::string& caller) const {
  if (slot < 0 || slot >= options_.max_sequences)
    throw EngineError("[engine] " + caller + "slot " + std::to_string(slot) + " is outside 0.." +
                      std::to_string(options_.max_sequences - 1) + " (max_sequences, set at load)");
}

void Engine::select(int slot) {
  check_slot(slot, "");
  decode_end();
  bind_slot(slot);
}

Arg Engine::ids() const { return ws_->ids.part(slot_); }
uint32_t* Engine::host_ids() const { return static_cast<uint32_t*>(ws_->ids.host(slot_)); }

void Engine::reset() {
  decode_end();
  ws_->clear_state(slot_);
  *seq_ = Sequence{};
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
}

std::vector<uint32_t> Engine::tokens() const {
  const auto* ids = host_ids();
  return std::vector<uint32_t>(ids, ids + seq_->position);
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

gpu::GpuError Engine::step_failed(const std::string& kind, const std::vector<int>& slots,
                                  const gpu::GpuError& cause) {
  if (decoding_) {
    for (auto& step : decoding_->in_flight) drain(step.first);
    decoding_.reset();
  }
  std::string names;
  for (int slot : slots) {
    ws_->clear_state(slot);
    sequences_[size_t(slot)] = Sequence{};
    names += (names.empty() ? "" : ", ") + std::to_string(slot);
  }
  // A step stopped between penalty_count and penalty_apply leaves counts that must be zero.
  std::memset(ws_->penalty_counts->contents(), 0, ws_->penalty_counts->size());
  counters_.failed_steps += 1;
  return gpu::GpuError("[engine] " + kind + " failed on the GPU; slot" + (slots.size() > 1 ? "s " : " ") + names +
                       " reset to an empty sequence: " + cause.what());
}

std::vector<float> Engine::prefill(const std::vector<uint32_t>& tokens, const Sampling& sampling, bool all_logits,
                                   bool last_logits, const PrefillProgress& progress,
                                   const std::vector<int>& snapshot_at,
                                   std::vector<std::shared_ptr<Snapshot>>* snapshots) {
  decode_end();
  if (tokens.empty()) throw EngineError("[engine] prefill needs at least one token");
  check_sampling(sampling);
  // One slot past the last token receives the chosen next token.
  check_room(tokens.size() + 1);
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  for (uint32_t t : tokens)
    if (t >= vocab) throw EngineError("[engine] token id " + std::to_string(t) + " is outside the vocabulary");
  std::memcpy(host_ids() + seq_->position, tokens.data(), tokens.size() * 4);

  const int end = seq_->position + int(tokens.size());
  seq_->generated_from = end;
  seq_->logprob_position = sampling.logprobs >= 0 ? end : -1;  // the choice's entry (ring slot end)
  for (size_t i = 0; i < snapshot_at.size(); ++i)
    if (snapshot_at[i] <= seq_->position || snapshot_at[i] > end || (i > 0 && snapshot_at[i] <= snapshot_at[i - 1]))
      throw EngineError("[engine] snapshot positions must ascend within (" + std::to_string(seq_->position) + ", " +
                        std::to_string(end) + "]");
  auto next_snapshot = snapshot_at.begin();

  std::vector<float> logits;
  if (all_logits) logits.reserve(tokens.size() * vocab);
  // Chunks committed and not yet waited for, oldest first: they queue behind each other on the
  // GPU, the host keeps at most two in flight, and only logits force a wait.
  std::deque<Submitted> in_flight;
  const size_t snapshots_before = snapshots ? snapshots->size() : 0;
  auto settle = [&](size_t keep) {  // waits until at most `keep` chunks are in flight
    try {
      for (; in_flight.size() > keep; in_flight.pop_front()) wait(in_flight.front());
    } catch (const gpu::GpuError& e) {
      // The state holds part of a chunk: the slot starts over, and this call's snapshots go.
      for (Submitted& step : in_flight) drain(step);
      if (snapshots) snapshots->resize(snapshots_before);
      throw step_failed("prefill chunk", {slot_}, e);
    }
  };
  for (size_t done = 0; done < tokens.size();) {
    // A chunk ends at the next snapshot position, so the state there can be copied.
    size_t limit = tokens.size() - done;
    if (next_snapshot != snapshot_at.end()) limit = std::min<size_t>(limit, *next_snapshot - seq_->position);
    const uint32_t rows = uint32_t(std::min<size_t>(ws_->max_rows, limit));
    const bool last = done + rows == tokens.size();
    const uint32_t logit_row0 = all_logits ? 0 : last ? rows - 1 : rows;
    Encoder enc(*device_, kernels_, "prefill chunk");
    encode_step(enc, rows, logit_row0, last ? &sampling : nullptr, true);
    if (mtp_) {
      encode_mtp_prefill_chunk(enc, rows);
      seq_->mtp_row = int(rows) - 1;  // after the last chunk: the pair of the last prompt token and the chosen one
    }
    if (next_snapshot != snapshot_at.end() && *next_snapshot == seq_->position + int(rows)) {
      if (snapshots) snapshots->push_back(encode_snapshot(enc, *next_snapshot));
      ++next_snapshot;
    }
    in_flight.push_back(commit(enc));
    seq_->position += int(rows);  // counted now; a failed wait below resets the slot
    done += rows;
    settle(1);
    if (progress) {
      try {
        progress(done, tokens.size());
      } catch (...) {
        settle(0);  // the submitted chunks finish: the state holds exactly position() tokens
        throw;
      }
    }
    if (all_logits || (last && last_logits)) {
      settle(0);
      const float* l = static_cast<const float*>(ws_->logits->contents());
      logits.insert(logits.end(), l, l + size_t(rows - logit_row0) * vocab);
    }
  }
  settle(0);
  return logits;
}

void Engine::decode_begin(int max_tokens, const Sampling& sampling) {
  if (decoding_) decode_end();
  seq_->mtp_row = -1;  // decode steps do not run the MTP head
  check_sampling(sampling);
  decoding_.emplace();
  seq_->logprob_position = -1;
  decoding_->sampling = sampling;
  decoding_->max_tokens = max_tokens;
}

void Engine::commit_decode_step() {
  check_room(2);
  Encoder enc(*device_, kernels_, "decode step");
  encode_step(enc, 1, 0, &decoding_->sampling, false);
  decoding_->in_flight.emplace_back(commit(enc), seq_->position + 1);
  seq_->position += 1;
  decoding_->committed += 1;
  counters_.tokens_decoded += 1;
  counters_.max_steps_in_flight = std::max<uint64_t>(counters_.max_steps_in_flight, decoding_->in_flight.size());
}

std::optional<uint32_t> Engine::decode_next() {
  if (!decoding_) throw EngineError("[engine] decode_next without decode_begin");
  Decoding& d = *decoding_;
  if (d.returned >= d.max_tokens) return std::nullopt;
  const auto* ids = host_ids();
  const int steps = d.max_tokens - 1;  // the last token is returned, never fed
  if (d.committed < steps) commit_decode_step();
  int returned_position;
  if (d.returned == 0) {  // the token prefill (or the last decode) chose
    returned_position = seq_->position - d.committed;
  } else {
    auto [step, slot] = std::move(d.in_flight.front());
    d.in_flight.pop_front();
    try {
      wait(step);
    } catch (const gpu::GpuError& e) {
      throw step_failed("decode step", {slot_}, e);
    }
    returned_position = slot;
  }
  d.returned += 1;
  seq_->logprob_position = d.sampling.logprobs >= 0 ? returned_position : -1;
  return ids[returned_position];
}

std::optional<TokenLogprobs> Engine::last_logprobs() const {
  if (seq_->logprob_position < 0) return std::nullopt;
  // The step that wrote this ring slot was waited for; the ones in flight write other slots.
  const auto* entry = static_cast<const uint32_t*>(ws_->logprobs.host(slot_)) +
                      size_t(seq_->logprob_position % MQ_LOGPROB_SLOTS) * MQ_LOGPROB_ENTRY_WORDS;
  auto as_float = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  TokenLogprobs out;
  out.logprob = as_float(entry[1]);
  for (uint32_t r = 0; r < entry[3]; ++r)
    out.top.emplace_back(entry[4 + r], as_float(entry[4 + MQ_LOGPROB_MAX_TOP + r]));
  return out;
}

void Engine::decode_end() {
  if (!decoding_) return;
  try {
    for (auto& in_flight = decoding_->in_flight; !in_flight.empty(); in_flight.pop_front())
      wait(in_flight.front().first);
  } catch (const gpu::GpuError& e) {
    throw step_failed("decode step", {slot_}, e);
  }
  decoding_.reset();
}

}  // namespace mq::engine
