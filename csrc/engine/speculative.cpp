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

void Engine::encode_verification(Encoder& enc, const StepSegments& segs, const std::vector<Sampling>& samplings) {
  const uint32_t V = uint32_t(model_.dims.vocab);
  const StepSegment& last = segs.seg[segs.count - 1];
  auto slot_ids = [&](const StepSegment& g) { return ws_->ids.part(int(g.slot)); };
  // A choice per row into verify_chosen: argmax over every row when a segment is greedy, then
  // the sampled segments' rows (in draft mode), which replace theirs.
  if (std::any_of(samplings.begin(), samplings.end(), [](const Sampling& s) { return s.temperature <= 0.0f; }))
    encode_argmax(enc, ws_->logits, last.first_row + last.rows, ws_->verify_chosen, 0);
  bool overlap = false;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    const Sampling& s = samplings[i];
    if (s.temperature <= 0.0f) continue;
    // Row r samples the token at position draft_pos + r with that position's Philox counter, as decode does.
    const uint32_t drafts = g.rows - 1, draft_pos = g.position + 1;
    const SampleParams p = sample_params(s, draft_pos, 0, drafts, draft_pos);
    enc.dispatch(*k_.sample,
                 {Arg(ws_->logits, size_t(g.first_row) * V * 4), Arg(ws_->verify_chosen, size_t(g.first_row) * 4),
                  Arg::value(p), slot_ids(g)},
                 {g.rows}, {k_.sample->threads}, overlap);
    overlap = true;
  }
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    const SpecAcceptParams ap{.drafts = g.rows - 1, .draft_pos = g.position + 1};
    enc.dispatch(*k_.spec_accept,
                 {slot_ids(g), Arg(ws_->verify_chosen, size_t(g.first_row) * 4), Arg(ws_->accepted, size_t(i) * 4),
                  Arg::value(ap)},
                 {1}, {k_.spec_accept->threads}, i > 0);
  }
  encode_rollbacks(enc, segs);
}

bool Engine::encode_rollbacks(Encoder& enc, const StepSegments& segs) {
  const ModelDims& d = model_.dims;
  bool overlap = false;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    if (g.rows == 1) continue;
    const DeltaRestoreParams rp{
        .state_floats = uint32_t(state_words(d)), .state_snap_stride = uint32_t(state_words(d)), .planes = g.rows - 1};
    for (const LayerWeights& l : layers_) {
      if (!l.delta) continue;
      enc.dispatch_threads(*k_.delta_restore,
                           {l.state.part(int(g.slot)), l.state_snaps.part(int(g.slot)),
                            Arg(ws_->accepted, size_t(i) * 4), Arg::value(rp)},
                           {rp.state_floats / 4}, overlap);
      overlap = true;
    }
  }
  return overlap;
}

void Engine::count_verified(uint32_t drafted, uint32_t accepted) {
  counters_.tokens_decoded += accepted + 1;
  counters_.drafted += drafted;
  counters_.accepted += accepted;
  if (counters_.drafted_at.size() < drafted) {
    counters_.drafted_at.resize(drafted);
    counters_.accepted_at.resize(drafted);
  }
  for (uint32_t i = 0; i < drafted; ++i) {
    counters_.drafted_at[i] += 1;
    counters_.accepted_at[i] += i < accepted;
  }
}

std::vector<uint32_t> Engine::verify(int slot, const std::vector<uint32_t>& drafts, const Sampling& sampling) {
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  for (uint32_t t : drafts)
    if (t >= vocab) throw EngineError("[engine] draft id " + std::to_string(t) + " is outside the vocabulary");
  return run_verify(slot, uint32_t(drafts.size()), sampling, &drafts);
}

std::vector<uint32_t> Engine::verify_mtp(int slot, uint32_t drafts, const Sampling& sampling) {
  if (!mtp_) throw EngineError("[engine] verify_mtp needs the MTP head (load it with the engine option mtp)");
  return run_verify(slot, drafts, sampling, nullptr);
}

void Engine::verify_rows(int slot, const std::vector<uint32_t>& drafts) {
  if (has_head()) throw EngineError("[engine] verify_rows: the engine with the head verifies (verify)");
  Sequence& q = sequence(slot);
  const auto k = uint32_t(drafts.size());
  if (k > uint32_t(options_.max_draft))
    throw EngineError("[engine] " + std::to_string(k) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  for (uint32_t t : drafts)
    if (t >= uint32_t(model_.dims.vocab))
      throw EngineError("[engine] draft id " + std::to_string(t) + " is outside the vocabulary");
  decode_end();
  check_room(size_t(k) + 2, q);
  std::memcpy(host_ids(slot) + q.position + 1, drafts.data(), size_t(k) * 4);
  Encoder enc(*device_, kernels_, "verify rows");
  ForwardPass pass = ForwardPass::one_slot(slot, q.position, k + 1, true);
  pass.snapshot_rows = k;
  encode_forward(enc, pass);
  commit_and_wait(enc, "verify rows", slot);
}

void Engine::verify_accept(int slot, uint32_t drafts, uint32_t accepted, uint32_t next) {
  if (has_head()) throw EngineError("[engine] verify_accept: the engine with the head accepts by itself (verify)");
  Sequence& q = sequence(slot);
  if (accepted > drafts || drafts > uint32_t(options_.max_draft))
    throw EngineError("[engine] verify_accept: " + std::to_string(accepted) + " of " + std::to_string(drafts) +
                      " drafts accepted (max_draft " + std::to_string(options_.max_draft) + ")");
  if (drafts > 0) {
    // The rollback of encode_verification, with the head's accepted count written by the host.
    *static_cast<uint32_t*>(ws_->accepted->contents()) = accepted;
    StepSegments segs{.count = 1};
    segs.seg[0] = StepSegment{.slot = uint32_t(slot), .rows = drafts + 1};
    Encoder enc(*device_, kernels_, "verify rollback");
    encode_rollbacks(enc, segs);
    commit_and_wait(enc, "verify rollback", slot);
  }
  q.position += int(accepted) + 1;
  host_ids(slot)[q.position] = next;
  q.logprob_position = -1;
  counters_.verify_steps += 1;
  count_verified(drafts, accepted);
}

std::vector<uint32_t> Engine::mtp_drafts(int slot, uint32_t drafts) {
  if (!mtp_) throw EngineError("[engine] mtp_drafts needs the MTP head (load it with the engine option mtp)");
  Sequence& q = sequence(slot);
  if (drafts > uint32_t(options_.max_draft))
    throw EngineError("[engine] " + std::to_string(drafts) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  decode_end();
  if (!q.mtp_carry || drafts == 0) return {};
  check_room(size_t(drafts) + 2, q);  // as the verify step that feeds them
  Encoder enc(*device_, kernels_, "MTP drafts");
  encode_mtp_drafts(enc, slot, q.position, drafts);
  commit_and_wait(enc, "MTP drafts", slot);
  const auto* ids = host_ids(slot) + q.position + 1;
  return std::vector<uint32_t>(ids, ids + drafts);
}

std::vector<uint32_t> Engine::verify_dflash(int slot, uint32_t drafts, const Sampling& sampling) {
  if (!dflash_) throw EngineError("[engine] verify_dflash needs a DFlash drafter (load it with draft=)");
  return run_verify(slot, drafts, sampling, nullptr);
}

std::vector<uint32_t> Engine::run_verify(int slot, uint32_t k, const Sampling& sampling,
                                         const std::vector<uint32_t>* host_drafts) {
  // A range's engine with the head verifies host drafts; the MTP head needs the whole model.
  if (!host_drafts || !has_head()) check_whole("a verify step");
  Sequence& q = sequence(slot);
  if (k > uint32_t(options_.max_draft))
    throw EngineError("[engine] " + std::to_string(k) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  if (sampling.penalised()) throw EngineError("[engine] a verify step takes no penalties: decode instead");
  if (sampling.logprobs >= 0) throw EngineError("[engine] a verify step reports no logprobs: decode instead");
  if (sampling.constrained())
    throw EngineError("[engine] a verify step takes no logit_bias or token mask: decode or step instead");
  decode_end();
  check_room(size_t(k) + 2, q);  // the rows fed, and the token chosen after the last
  Encoder enc(*device_, kernels_, "verify step");
  if (host_drafts) {
    std::memcpy(host_ids(slot) + q.position + 1, host_drafts->data(), size_t(k) * 4);
  } else if (dflash_) {
    // The drafter's block from the context every pass so far left in its caches; the verify
    // pass below then projects its own rows there (the accepted ones are the next context).
    if (k > 0) encode_dflash_block(enc, slot, q.position, k + 1);
  } else if (!q.mtp_carry) {
    k = 0;  // no head state to draft from (after a plain decode step or a restore): a one-row step
  } else if (k > 0) {
    encode_mtp_drafts(enc, slot, q.position, k);
  }
  ForwardPass pass = ForwardPass::one_slot(slot, q.position, k + 1, true);
  pass.snapshot_rows = k;
  if (mtp_) write_head_tail(pass.segs);
  encode_forward(enc, pass);
  encode_verification(enc, pass.segs, {sampling});
  if (mtp_) {
    // The head over the verified rows (pairs with the drafts and the next token; rows past the
    // accepted ones are rewritten by the next step), for the next step's drafts.
    encode_mtp(enc, slot, k + 1, q.position, mtp_trunk_hidden(), uint32_t(model_.dims.hidden), k + 1);
    const Arg accepted(ws_->accepted);
    encode_mtp_carry(enc, slot, 0, k > 0 ? &accepted : nullptr, k + 1, false);
  }
  commit_and_wait(enc, "verify step", slot);

  const auto* ids = host_ids(slot);
  const uint32_t a = *static_cast<const uint32_t*>(ws_->accepted->contents());
  std::vector<uint32_t> out(ids + q.position + 1, ids + q.position + 2 + a);  // accepted drafts, then the next token
  q.position += int(a) + 1;
  q.mtp_carry = mtp_ != nullptr;
  q.logprob_position = -1;
  counters_.verify_steps += 1;
  count_verified(k, a);
  return out;
}

}  // namespace mq::engine
