// Choosing the next token on the GPU from a row of logits (shaders/sampling.metal): penalties
// when asked, then argmax at temperature 0 or the seeded sampler, then the logprobs when asked.
#include <algorithm>

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

void Engine::encode_choice(Encoder& enc, int slot, uint32_t logit_row, const Sampling& s, uint32_t out_pos) {
  const uint32_t V = uint32_t(model_.dims.vocab);
  const Arg raw(ws_->logits, size_t(logit_row) * V * 4);
  Arg logits = raw;
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
