// Choosing the next token on the GPU from a row of logits (shaders/sampling.metal): a grammar's
// token mask, logit_bias and penalties when asked, then argmax at temperature 0 or the seeded
// sampler, then the logprobs when asked.
#include <algorithm>
#include <cstring>

#include "workspace.h"

namespace mq::engine {

void Engine::encode_argmax(Encoder& enc, const Arg& logits, uint32_t rows, const Arg& out, uint32_t out_pos) {
  const uint32_t V = uint32_t(model_.dims.vocab);
  const ArgmaxParams p{
      .n = V, .row_stride = V, .chunk = ws_->argmax_chunk, .n_partials = ws_->argmax_partials, .out_pos = out_pos};
  enc.dispatch(*k_.argmax_partial, {logits, ws_->partials, Arg::value(p)}, {p.n_partials, rows});
  enc.dispatch(*k_.argmax_final, {ws_->partials, out, Arg::value(p)}, {rows});
}

SampleParams Engine::sample_params(const Sampling& s, uint32_t counter, uint32_t out_pos, uint32_t drafts,
                                   uint32_t draft_pos) const {
  const uint32_t V = uint32_t(model_.dims.vocab);
  return SampleParams{.n = V,
                      .row_stride = V,
                      .top_k = uint32_t(std::max(s.top_k, 0)),
                      .top_p = s.top_p,
                      .temperature = s.temperature,
                      .min_p = s.min_p,
                      .seed_lo = uint32_t(s.seed),
                      .seed_hi = uint32_t(s.seed >> 32),
                      .counter = counter,
                      .out_pos = out_pos,
                      .drafts = drafts,
                      .draft_pos = draft_pos};
}

uint32_t* Engine::token_masks() const { return static_cast<uint32_t*>(ws_->token_masks->contents()); }

void Engine::write_logit_bias(int slot, const Sampling& s) {
  Sequence& q = sequences_[size_t(slot)];
  if (s.logit_bias.empty() || s.logit_bias == q.logit_bias) return;  // unused, or there already
  for (const InFlight& step : in_flight_)
    for (uint32_t i = 0; i < step.segs.count; ++i)
      if (step.segs.seg[i].slot == uint32_t(slot))
        throw EngineError("[engine] step_commit: slot " + std::to_string(slot) +
                          ": a new logit_bias while its steps are in flight (they read the old one): step_wait first");
  q.logit_bias = s.logit_bias;
  auto* table = static_cast<uint32_t*>(ws_->logit_bias.host(slot));
  for (size_t i = 0; i < MQ_LOGIT_BIAS_MAX; ++i) {
    const bool used = i < s.logit_bias.size();
    table[2 * i] = used ? s.logit_bias[i].first : UINT32_MAX;  // an id >= vocab: skipped
    float bias = used ? s.logit_bias[i].second : 0.0f;
    std::memcpy(&table[2 * i + 1], &bias, 4);
  }
}

void Engine::encode_choice(Encoder& enc, int slot, uint32_t logit_row, const Sampling& s, uint32_t out_pos) {
  if (!has_head()) return;  // the head's engine chooses; the host hands its choice over (set_chosen)
  const uint32_t V = uint32_t(model_.dims.vocab);
  const Arg raw(ws_->logits, size_t(logit_row) * V * 4);
  if (s.token_mask) {
    // In place, first: the logprobs below then see the masked row, as vLLM's (taken after its
    // grammar bitmask, before logit_bias and penalties).
    const uint32_t W = mask_words();
    const TokenMaskParams mp{.n = V, .row_stride = V, .mask_words = W, .mask_stride = W};
    enc.dispatch_threads(*k_.token_mask, {raw, Arg(ws_->token_masks, size_t(slot) * W * 4), Arg::value(mp)}, {V, 1});
  }
  Arg logits = raw;
  if (!s.logit_bias.empty()) {
    // On a copy, so the logprobs stay unbiased (as vLLM's); before the penalties, as vLLM applies them.
    const CopyParams cp{.cols = V, .rows = 1, .src_offset = 0, .src_stride = 0, .dst_offset = 0, .dst_stride = 0};
    enc.dispatch_threads(*k_.copy_u32, {raw, ws_->biased, Arg::value(cp)}, {V, 1});
    const LogitBiasParams bp{.n = V, .row_stride = V};
    enc.dispatch_threads(*k_.logit_bias, {ws_->biased, ws_->logit_bias.part(slot), Arg::value(bp)},
                         {MQ_LOGIT_BIAS_MAX, 1});
    logits = Arg(ws_->biased);
  }
  if (s.penalised()) {
    // The penalised copy is chosen from; the logits buffer (returned to callers) stays raw.
    const uint32_t generated_from = uint32_t(sequences_[size_t(slot)].generated_from);
    const uint32_t start = s.repetition_penalty != 1.0f ? 0u : std::min(generated_from, out_pos);
    const PenaltyParams pp{.n = V,
                           .start = start,
                           .generated_from = generated_from,
                           .end = out_pos,
                           .repetition = s.repetition_penalty,
                           .presence = s.presence_penalty,
                           .frequency = s.frequency_penalty};
    if (out_pos > start)
      enc.dispatch_threads(*k_.penalty_count, {ids(slot), ws_->penalty_counts, Arg::value(pp)}, {out_pos - start});
    enc.dispatch_threads(*k_.penalty_apply, {logits, ws_->penalty_counts, ws_->penalised, Arg::value(pp)}, {V});
    logits = Arg(ws_->penalised);
  }
  if (s.temperature <= 0.0f) {
    encode_argmax(enc, logits, 1, ids(slot), out_pos);
  } else {
    const SampleParams p = sample_params(s, out_pos, out_pos, 0, 0);
    enc.dispatch(*k_.sample, {logits, ids(slot), Arg::value(p), ids(slot)}, {1});
  }
  if (s.logprobs >= 0) {
    // Over the raw row (vLLM's default), once the choice above wrote ids[out_pos].
    const LogprobParams p{
        .n = V, .top_n = std::min(uint32_t(s.logprobs), V), .out_pos = out_pos, .slot = out_pos % MQ_LOGPROB_SLOTS};
    enc.dispatch(*k_.logprobs, {raw, ids(slot), ws_->logprobs.part(slot), Arg::value(p)}, {1});
  }
}

}  // namespace mq::engine
