// Speculative verify steps: the chosen token and k drafts run as k + 1 rows of one step
// on the matvec path (the weights stream once for all rows), every DeltaNet state is
// snapshotted after each draft row (the conv history is a ring by position: nothing to
// keep), and the GPU decides: a choice per row (argmax, or the sampler in draft mode),
// spec_accept counting the accepted drafts, delta_restore rolling the recurrent state back
// to the last accepted row. The host waits once per step.
#include <algorithm>
#include <cstring>

#include "mtp.h"

namespace mq::engine {

uint32_t Engine::chosen() const { return static_cast<const uint32_t*>(ws_->ids->contents())[position_]; }

void Engine::encode_verification(Encoder& enc, uint32_t drafts, const Sampling& s) {
  const uint32_t V = uint32_t(model_.dims.vocab), rows = drafts + 1, draft_pos = uint32_t(position_) + 1;
  if (s.temperature <= 0.0f) {
    encode_argmax(enc, ws_->logits, rows, ws_->verify_chosen, 0);
  } else {
    // Row r samples the token at position draft_pos + r with that position's Philox counter, as decode does.
    const SampleParams p{V,         V,         uint32_t(std::max(s.top_k, 0)), s.top_p, s.temperature, s.min_p,
                         uint32_t(s.seed), uint32_t(s.seed >> 32), draft_pos, 0, drafts, draft_pos};
    enc.dispatch(*k_.sample, {ws_->logits, ws_->verify_chosen, Arg::value(p), ws_->ids}, {rows});
  }
  const SpecAcceptParams ap{drafts, draft_pos};
  enc.dispatch(*k_.spec_accept, {ws_->ids, ws_->verify_chosen, ws_->accepted, Arg::value(ap)}, {1});
  if (drafts == 0) return;
  // Every layer's rollback is independent of the others': one barrier for all of them.
  const ModelDims& d = model_.dims;
  const DeltaRestoreParams rp{uint32_t(state_words(d)), uint32_t(state_words(d)), drafts};
  bool first = true;
  for (const LayerWeights& l : layers_) {
    if (!l.delta) continue;
    enc.dispatch_threads(*k_.delta_restore, {l.state, l.state_snaps, ws_->accepted, Arg::value(rp)},
                         {rp.state_floats / 4}, !first);
    first = false;
  }
}

void Engine::encode_mtp_drafts(Encoder& enc, uint32_t k) {
  const uint32_t H = uint32_t(model_.dims.hidden), p = uint32_t(position_);
  matvec_ = true;  // one row at a time: stream the head's weights and the lm_head once
  // Draft i (at ids[p + i]) is the argmax of the head's logits for the pair one position before it.
  encode_mtp_logits(enc, uint32_t(mtp_row_), uint32_t(mtp_row_) + 1);
  encode_argmax(enc, ws_->logits, 1, ws_->ids, p + 1);
  for (uint32_t i = 2; i <= k; ++i) {
    // The pair (the head's last output, draft i - 1) at position p + i - 2; one row, into mtp_hidden row 0.
    const uint32_t from = i == 2 ? uint32_t(mtp_row_) : 0;
    encode_mtp(enc, 1, int(p + i - 2), Arg(ws_->mtp_hidden, size_t(from) * H * 4), H, 0);
    encode_argmax(enc, ws_->logits, 1, ws_->ids, p + i);
  }
}

std::vector<uint32_t> Engine::verify(const std::vector<uint32_t>& drafts, const Sampling& sampling) {
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  for (uint32_t t : drafts)
    if (t >= vocab) throw EngineError("[engine] draft id " + std::to_string(t) + " is outside the vocabulary");
  return run_verify(uint32_t(drafts.size()), sampling, &drafts);
}

std::vector<uint32_t> Engine::verify_mtp(uint32_t drafts, const Sampling& sampling) {
  if (!mtp_) throw EngineError("[engine] verify_mtp needs the MTP head (load it with the engine option mtp)");
  return run_verify(drafts, sampling, nullptr);
}

std::vector<uint32_t> Engine::run_verify(uint32_t k, const Sampling& sampling,
                                         const std::vector<uint32_t>* host_drafts) {
  if (k > uint32_t(options_.max_draft))
    throw EngineError("[engine] " + std::to_string(k) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  if (sampling.penalised()) throw EngineError("[engine] a verify step takes no penalties: decode instead");
  if (sampling.logprobs >= 0) throw EngineError("[engine] a verify step reports no logprobs: decode instead");
  decode_end();
  check_room(size_t(k) + 2);  // the rows fed, and the token chosen after the last
  Encoder enc(*device_, kernels_);
  if (host_drafts) {
    std::memcpy(static_cast<uint32_t*>(ws_->ids->contents()) + position_ + 1, host_drafts->data(), size_t(k) * 4);
  } else if (mtp_row_ < 0) {
    k = 0;  // no head state to draft from (after a plain decode step or a restore): a one-row step
  } else if (k > 0) {
    encode_mtp_drafts(enc, k);
  }
  snap_rows_ = k;
  encode_step(enc, k + 1, 0, nullptr, false);
  snap_rows_ = 0;
  encode_verification(enc, k, sampling);
  if (mtp_) {
    // The head over the verified rows (pairs with the drafts and the next token; rows past the
    // accepted ones are rewritten by the next step), for the next step's drafts.
    const Arg hidden = options_.mtp_hidden == MtpHidden::pre_norm ? Arg(ws_->x) : Arg(ws_->xn);
    encode_mtp(enc, k + 1, position_, hidden, uint32_t(model_.dims.hidden), k + 1);
  }
  auto cb = commit(enc);
  wait(*cb);

  const auto* ids = static_cast<const uint32_t*>(ws_->ids->contents());
  const uint32_t a = *static_cast<const uint32_t*>(ws_->accepted->contents());
  std::vector<uint32_t> out(ids + position_ + 1, ids + position_ + 2 + a);  // accepted drafts, then the next token
  position_ += int(a) + 1;
  mtp_row_ = mtp_ ? int(a) : -1;
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
