// Speculative verify steps: the chosen token and k drafts run as k + 1 rows of one step
// on the matvec path (the weights stream once for all rows), every DeltaNet state is
// snapshotted after each draft row, and the GPU decides: a choice per row (argmax, or the
// sampler in draft mode), spec_accept counting the accepted drafts, delta_restore rolling
// the recurrent state back to the last accepted row. The host waits once per step.
#include <cstring>

#include "workspace.h"

namespace mq::engine {

uint32_t Engine::chosen() const { return static_cast<const uint32_t*>(ws_->ids->contents())[position_]; }

void Engine::encode_verification(Encoder& enc, uint32_t drafts, const Sampling& s) {
  const uint32_t V = uint32_t(model_.dims.vocab), rows = drafts + 1, draft_pos = uint32_t(position_) + 1;
  if (s.temperature <= 0.0f) {
    const ArgmaxParams p{V, V, ws_->argmax_chunk, ws_->argmax_partials, 0};
    enc.dispatch("argmax_partial", {ws_->logits, ws_->partials, Arg::value(p)}, {p.n_partials, rows});
    enc.dispatch("argmax_final", {ws_->partials, ws_->verify_chosen, Arg::value(p)}, {rows});
  } else {
    // Row r samples the token at position draft_pos + r with that position's Philox counter, as decode does.
    const SampleParams p{V,         V,         uint32_t(std::max(s.top_k, 0)), s.top_p, s.temperature, s.min_p,
                         uint32_t(s.seed), uint32_t(s.seed >> 32), draft_pos, 0, drafts, draft_pos};
    enc.dispatch("sample_top_kp", {ws_->logits, ws_->verify_chosen, Arg::value(p), ws_->ids}, {rows});
  }
  const SpecAcceptParams ap{drafts, draft_pos};
  enc.dispatch("spec_accept", {ws_->ids, ws_->verify_chosen, ws_->accepted, Arg::value(ap)}, {1});
  if (drafts == 0) return;
  // Every layer's rollback is independent of the others': one barrier for all of them.
  const ModelDims& d = model_.dims;
  const DeltaRestoreParams rp{uint32_t(state_words(d)), uint32_t(history_words(d)), uint32_t(state_words(d)),
                              uint32_t(history_words(d)), drafts};
  bool first = true;
  for (const LayerWeights& l : layers_) {
    if (!l.delta) continue;
    enc.dispatch_threads("delta_restore", {l.state, l.state_snaps, l.hist, l.hist_snaps, ws_->accepted, Arg::value(rp)},
                         {(rp.state_floats + rp.hist_floats) / 4}, !first);
    first = false;
  }
}

std::vector<uint32_t> Engine::verify(const std::vector<uint32_t>& drafts, const Sampling& sampling) {
  decode_end();
  const uint32_t k = uint32_t(drafts.size());
  if (k > uint32_t(options_.max_draft))
    throw EngineError("[engine] " + std::to_string(k) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  if (sampling.penalised()) throw EngineError("[engine] a verify step takes no penalties: decode instead");
  check_room(k + 2);  // the rows fed, and the token chosen after the last
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  for (uint32_t t : drafts)
    if (t >= vocab) throw EngineError("[engine] draft id " + std::to_string(t) + " is outside the vocabulary");
  auto* ids = static_cast<uint32_t*>(ws_->ids->contents());
  std::memcpy(ids + position_ + 1, drafts.data(), size_t(k) * 4);

  Encoder enc(*device_, kernels_);
  snap_rows_ = k;
  encode_step(enc, k + 1, 0, nullptr, false);
  snap_rows_ = 0;
  encode_verification(enc, k, sampling);
  auto cb = commit(enc);
  wait(*cb);

  const uint32_t a = *static_cast<const uint32_t*>(ws_->accepted->contents());
  std::vector<uint32_t> out(drafts.begin(), drafts.begin() + a);
  out.push_back(ids[position_ + 1 + a]);
  position_ += int(a) + 1;
  counters_.verify_steps += 1;
  counters_.tokens_decoded += a + 1;
  counters_.drafted += k;
  counters_.accepted += a;
  if (counters_.drafted_at.size() < k) {
    counters_.drafted_at.resize(k);
    counters_.accepted_at.resize(k);
  }
  for (uint32_t i = 0; i < k; ++i) {
    counters_.drafted_at[i] += 1;
    counters_.accepted_at[i] += i < a;
  }
  return out;
}

}  // namespace mq::engine
