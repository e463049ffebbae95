// Mixed steps: several sequence slots advanced by one command buffer (Engine::step). Their
// rows share one weight stream on the matvec path; attention and DeltaNet read each row's
// slot and position from the step's segment table, and each slot's choice, acceptance and
// rollback run as its own verify step would, so every slot gets the tokens it gets alone.
#include <algorithm>
#include <cstring>

#include "workspace.h"

namespace mq::engine {

void Engine::check_slot_step(const SlotStep& s, uint32_t rows_before) const {
  const std::string where = "[engine] step: slot " + std::to_string(s.slot);
  const Sequence& q = sequence(s.slot, "step: ");
  if (s.drafts.size() > size_t(options_.max_draft))
    throw EngineError(where + ": " + std::to_string(s.drafts.size()) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  if (!s.drafts.empty() && (s.sampling.penalised() || s.sampling.logprobs >= 0))
    throw EngineError(where + ": drafts take no penalties or logprobs (step that slot without drafts)");
  for (uint32_t t : s.drafts)
    if (t >= uint32_t(model_.dims.vocab))
      throw EngineError(where + ": draft id " + std::to_string(t) + " is outside the vocabulary");
  if (q.position == 0) throw EngineError(where + " holds no sequence (prefill it first)");
  check_room(s.drafts.size() + 2, q, "step: slot " + std::to_string(s.slot) + ": ");
  if (rows_before + 1 + s.drafts.size() > kMaxVerifyRows)
    throw EngineError("[engine] step: more than " + std::to_string(kMaxVerifyRows) +
                      " rows in one step (slots plus their drafts)");
  check_sampling(s.sampling);
}

std::vector<std::vector<uint32_t>> Engine::step(const std::vector<SlotStep>& steps) {
  if (steps.empty() || steps.size() > size_t(options_.max_sequences))
    throw EngineError("[engine] step takes 1.." + std::to_string(options_.max_sequences) + " slots, got " +
                      std::to_string(steps.size()));
  decode_end();
  ForwardPass pass;
  StepSegments& segs = pass.segs;
  std::vector<Sampling> samplings;
  uint32_t rows = 0;
  bool speculative = false;
  for (const SlotStep& s : steps) {
    for (uint32_t i = 0; i < segs.count; ++i)
      if (segs.seg[i].slot == uint32_t(s.slot))
        throw EngineError("[engine] step: slot " + std::to_string(s.slot) + " is listed twice");
    check_slot_step(s, rows);
    const uint32_t n = 1 + uint32_t(s.drafts.size());
    segs.seg[segs.count++] = {.slot = uint32_t(s.slot),
                              .first_row = rows,
                              .rows = n,
                              .position = uint32_t(sequences_[size_t(s.slot)].position)};
    samplings.push_back(s.sampling);
    rows += n;
    speculative |= !s.drafts.empty();
  }
  // Drafts go after each slot's chosen token (ids[position]); the verify rows read them there.
  for (const SlotStep& s : steps) {
    auto* ids = static_cast<uint32_t*>(ws_->ids.host(s.slot));
    std::memcpy(ids + sequences_[size_t(s.slot)].position + 1, s.drafts.data(), s.drafts.size() * 4);
  }

  Encoder enc(*device_, kernels_, "shared step");
  pass.rows = rows;
  pass.matvec = true;
  pass.snapshot_rows = speculative ? uint32_t(options_.max_draft) : 0;  // each segment keeps its first rows - 1
  encode_forward(enc, pass);
  // Slots with penalties or logprobs choose as a decode step does (penalty counts are per
  // step, so one at a time); the others as verify rows, all together.
  StepSegments verified{};
  std::vector<Sampling> verified_samplings;
  std::vector<uint32_t> verified_index(steps.size(), MQ_MAX_SEGMENTS);
  for (uint32_t i = 0; i < segs.count; ++i) {
    const Sampling& s = samplings[i];
    if (s.penalised() || s.logprobs >= 0) {
      encode_choice(enc, int(segs.seg[i].slot), segs.seg[i].first_row, s, segs.seg[i].position + 1);
    } else {
      verified_index[i] = verified.count;
      verified.seg[verified.count++] = segs.seg[i];
      verified_samplings.push_back(s);
    }
  }
  if (verified.count) encode_verification(enc, verified, verified_samplings);
  Submitted submitted = commit(enc);
  try {
    wait(submitted);
  } catch (const gpu::GpuError& e) {
    // Every slot of the step holds part of it: all of them start over.
    std::vector<int> slots;
    for (const SlotStep& s : steps) slots.push_back(s.slot);
    throw step_failed("shared step", slots, e);
  }

  const auto* accepted = static_cast<const uint32_t*>(ws_->accepted->contents());
  std::vector<std::vector<uint32_t>> out;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    Sequence& q = sequences_[g.slot];
    const uint32_t a = verified_index[i] < MQ_MAX_SEGMENTS ? accepted[verified_index[i]] : 0;
    const auto* ids = static_cast<const uint32_t*>(ws_->ids.host(int(g.slot)));
    out.emplace_back(ids + g.position + 1, ids + g.position + 2 + a);  // accepted drafts, then the next token
    q.position += int(a) + 1;
    q.mtp_row = -1;  // mixed steps do not run the MTP head
    q.logprob_position = samplings[i].logprobs >= 0 ? q.position : -1;
    count_verified(g.rows - 1, a);
  }
  counters_.verify_steps += speculative;
  return out;
}

}  // namespace mq::engine
