// Mixed steps: several sequence slots advanced by one command buffer (Engine::step). Their
// rows share one weight stream on the matvec path; attention and DeltaNet read each row's
// slot and position from the step's segment table, and each slot's choice, acceptance and
// rollback run as its own verify step would, so every slot gets the tokens it gets alone.
#include <algorithm>
#include <cstring>

#include "workspace.h"

namespace mq::engine {

uint32_t Engine::step_drafts(const SlotStep& s) const {
  // An MTP entry's drafts are made in the step, or were made ahead and given in `drafts`.
  const bool in_step = s.drafts.empty() && sequence(s.slot, "step: ").mtp_carry;
  return uint32_t(s.drafts.size()) + (in_step ? s.mtp_drafts : 0);
}

void Engine::check_slot_step(const SlotStep& s, uint32_t rows_before) const {
  const std::string where = "[engine] step: slot " + std::to_string(s.slot);
  const Sequence& q = sequence(s.slot, "step: ");
  const size_t asked = std::max<size_t>(s.drafts.size(), s.mtp_drafts);
  if (asked > size_t(options_.max_draft))
    throw EngineError(where + ": " + std::to_string(asked) + " drafts exceed max_draft " +
                      std::to_string(options_.max_draft) + " (set at load)");
  if (s.mtp_drafts > 0 && !mtp_)
    throw EngineError(where + ": MTP drafts need the MTP head (load it with the engine option mtp)");
  if (s.mtp_drafts > 0 && !s.drafts.empty() && (!q.mtp_carry || s.drafts.size() != s.mtp_drafts))
    throw EngineError(where + ": " + std::to_string(s.drafts.size()) + " drafts given with " +
                      std::to_string(s.mtp_drafts) +
                      " MTP drafts: given, they are the head's made ahead "
                      "(mtp_drafts), as many, from its state (" +
                      (q.mtp_carry ? "" : "not ") + "mtp_ready here)");
  if (s.mtp_drafts > 0 && s.drafts.empty() && q.mtp_carry && !range_.whole(model_.dims))
    throw EngineError(where +
                      ": an engine of a layer range takes the MTP head's drafts made ahead (mtp_drafts) "
                      "in drafts: the first engine embeds them");
  if (asked > 0 && (s.sampling.penalised() || s.sampling.logprobs >= 0 || s.sampling.constrained()))
    throw EngineError(where + ": drafts take no penalties, logprobs, logit_bias or token mask (give it none)");
  for (uint32_t t : s.drafts)
    if (t >= uint32_t(model_.dims.vocab))
      throw EngineError(where + ": draft id " + std::to_string(t) + " is outside the vocabulary");
  if (q.position == 0) throw EngineError(where + " holds no sequence (prefill it first)");
  const uint32_t drafts = step_drafts(s);
  check_room(size_t(drafts) + 2, q, "step: slot " + std::to_string(s.slot) + ": ");
  if (rows_before + 1 + drafts > max_step_rows())
    throw EngineError("[engine] step: more than " + std::to_string(max_step_rows()) +
                      " rows in one step (slots plus their drafts; max_draft, set at load, decides the limit)");
  check_sampling(s.sampling);
}

void Engine::write_head_tail(const StepSegments& segs) {
  // The MTP head's last row of a segment pairs with ids[position + rows], which the choice
  // writes only when every draft is accepted; else that row is discarded, but attention weighs
  // it by 0, so a stale id there (NaN rows) would reach the kept rows: a defined id instead.
  for (uint32_t i = 0; i < segs.count; ++i)
    host_ids(int(segs.seg[i].slot))[segs.seg[i].position + segs.seg[i].rows] = 0;
}

void Engine::encode_masked_choices(Encoder& enc, const StepSegments& segs, const std::vector<Sampling>& samplings,
                                   const std::vector<uint32_t>& masked, const BeforeChoice& before_choice) {
  // The forward pass runs while the host computes the masks (a grammar's next mask needs the
  // token this step feeds, and nothing of the GPU's).
  enc.split();
  try {
    if (before_choice) before_choice();
  } catch (...) {
    Submitted partial = commit(enc);
    drain(partial);
    for (uint32_t i = 0; i < segs.count; ++i) {  // their states hold this step's rows, their positions do not
      ws_->clear_state(int(segs.seg[i].slot));
      sequences_[segs.seg[i].slot] = Sequence{};
    }
    throw;
  }
  for (uint32_t i : masked)
    encode_choice(enc, int(segs.seg[i].slot), segs.seg[i].first_row, samplings[i], segs.seg[i].position + 1);
}

std::vector<int> Engine::InFlight::slots() const {
  std::vector<int> out;
  for (uint32_t i = 0; i < segs.count; ++i) out.push_back(int(segs.seg[i].slot));
  if (prompt_slot >= 0) out.push_back(prompt_slot);
  return out;
}

std::vector<std::vector<uint32_t>> Engine::step(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice,
                                                const PromptChunk* prompt,
                                                std::vector<std::shared_ptr<Snapshot>>* snapshots) {
  decode_end();  // the steps in flight first: the one waited for below is this one
  commit_shared_step(steps, before_choice, prompt);
  const InFlight f = wait_oldest();
  std::vector<std::vector<uint32_t>> out = finish_shared_step(f);
  if (prompt) {
    const Sequence& q = sequences_[size_t(prompt->slot)];
    const bool chose = prompt->last && has_head();
    out.push_back(chose ? std::vector<uint32_t>{host_ids(prompt->slot)[q.position]} : std::vector<uint32_t>{});
    if (unaccepted_ && prompt->last) unaccepted_->prompt_slot = prompt->slot;
    if (f.snapshot && snapshots) snapshots->push_back(f.snapshot);
  }
  return out;
}

void Engine::step_commit(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice) {
  if (!range_.whole(model_.dims))
    throw EngineError(
        "[engine] step_commit: an engine of a layer range waits for the rows of the engine before "
        "each step (step)");
  commit_shared_step(steps, before_choice, nullptr);
}

float* Engine::step_rows() const { return static_cast<float*>(ws_->step_rows->contents()); }

uint32_t Engine::step_rows_count() const {
  return options_.max_sequences > 1 && !range_.whole(model_.dims) ? max_step_rows() + ws_->max_rows : 0;
}

void Engine::encode_step_rows(Encoder& enc, uint32_t row, uint32_t rows, bool into_x) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  const uint32_t src = into_x ? row * H : 0, dst = into_x ? 0 : row * H;
  const CopyParams p{.cols = H, .rows = rows, .src_offset = src, .src_stride = H, .dst_offset = dst, .dst_stride = H};
  const Arg from = into_x ? Arg(ws_->step_rows) : Arg(ws_->x), to = into_x ? Arg(ws_->x) : Arg(ws_->step_rows);
  enc.dispatch_threads(*k_.copy_u32, {from, to, Arg::value(p)}, {H, rows});
}

void Engine::step_accept(const std::vector<SlotOutcome>& outcomes, std::optional<uint32_t> prompt_token) {
  if (has_head()) throw EngineError("[engine] step_accept: the engine with the head accepts by itself (step)");
  if (!unaccepted_) throw EngineError("[engine] step_accept: no shared step waits for the head's outcome (step first)");
  const StepSegments segs = unaccepted_->segs;
  const int prompt_slot = unaccepted_->prompt_slot;
  if (outcomes.size() != segs.count)
    throw EngineError("[engine] step_accept: " + std::to_string(outcomes.size()) + " outcomes for a step of " +
                      std::to_string(segs.count) + " entries");
  if (prompt_token.has_value() != (prompt_slot >= 0))
    throw EngineError(std::string("[engine] step_accept: the step ") +
                      (prompt_slot >= 0 ? "fed a prompt's last chunk: give its first token (prompt_token)"
                                        : "fed no prompt's last chunk: no prompt_token"));
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  auto* accepted = static_cast<uint32_t*>(ws_->accepted->contents());
  for (uint32_t i = 0; i < segs.count; ++i) {
    const SlotOutcome& o = outcomes[i];
    const StepSegment& g = segs.seg[i];
    const std::string where = "[engine] step_accept: entry " + std::to_string(i);
    if (o.slot != int(g.slot))
      throw EngineError(where + " names slot " + std::to_string(o.slot) + ", the step's slot " +
                        std::to_string(g.slot));
    if (o.accepted > g.rows - 1)
      throw EngineError(where + ": " + std::to_string(o.accepted) + " of " + std::to_string(g.rows - 1) +
                        " drafts accepted");
    if (o.next >= vocab)
      throw EngineError(where + ": token id " + std::to_string(o.next) + " is outside the vocabulary");
    accepted[i] = o.accepted;  // read by the rollback below
  }
  if (prompt_token && *prompt_token >= vocab)
    throw EngineError("[engine] step_accept: prompt token id " + std::to_string(*prompt_token) +
                      " is outside the vocabulary");
  unaccepted_.reset();
  // The rollbacks of encode_verification, with the head's accepted counts: one command buffer.
  Encoder enc(*device_, kernels_, "shared step rollback");
  const bool rolled = encode_rollbacks(enc, segs);
  if (rolled) {
    Submitted step = commit(enc);
    try {
      wait(step);
    } catch (const gpu::GpuError& e) {
      std::vector<int> slots;  // those whose states were being rolled back
      for (uint32_t i = 0; i < segs.count; ++i)
        if (segs.seg[i].rows > 1) slots.push_back(int(segs.seg[i].slot));
      throw step_failed("shared step rollback", slots, e);
    }
  }
  for (uint32_t i = 0; i < segs.count; ++i) {
    Sequence& q = sequences_[segs.seg[i].slot];
    q.position += int(outcomes[i].accepted);
    host_ids(int(segs.seg[i].slot))[q.position] = outcomes[i].next;
    count_verified(segs.seg[i].rows - 1, outcomes[i].accepted);
  }
  counters_.verify_steps += rolled ? 1 : 0;
  if (prompt_token) host_ids(prompt_slot)[sequences_[size_t(prompt_slot)].position] = *prompt_token;
}

void Engine::check_prompt_chunk(const PromptChunk& p, const std::vector<SlotStep>& steps) const {
  const std::string where = "[engine] step: prompt chunk of slot " + std::to_string(p.slot);
  const Sequence& q = sequence(p.slot, "step: prompt chunk: ");
  for (const SlotStep& s : steps)
    if (s.slot == p.slot) throw EngineError(where + ": the slot is also listed as a step entry");
  if (p.tokens.empty() || p.tokens.size() > ws_->max_rows)
    throw EngineError(where + ": " + std::to_string(p.tokens.size()) + " tokens (1.." + std::to_string(ws_->max_rows) +
                      " per chunk, the engine's max_rows)");
  for (uint32_t t : p.tokens)
    if (t >= uint32_t(model_.dims.vocab))
      throw EngineError(where + ": token id " + std::to_string(t) + " is outside the vocabulary");
  check_room(p.tokens.size() + 1, q, "step: prompt chunk of slot " + std::to_string(p.slot) + ": ");
  check_sampling(p.sampling);
  if (p.images) check_images(*p.images, q, p.tokens.size(), "step: prompt chunk of slot " + std::to_string(p.slot));
}

void Engine::encode_prompt_chunk(Encoder& enc, const PromptChunk& p, InFlight& f, uint32_t io_row) {
  // As one chunk of prefill: the same pass, choice, MTP rows and snapshot, in the step's buffers.
  Sequence& q = sequences_[size_t(p.slot)];
  const uint32_t rows = uint32_t(p.tokens.size());
  std::memcpy(host_ids(p.slot) + q.position, p.tokens.data(), rows * 4);
  write_logit_bias(p.slot, p.sampling);
  ForwardPass pass = ForwardPass::one_slot(p.slot, q.position, rows, false);
  pass.logit_row0 = p.last ? rows - 1 : rows;  // the last row's logits, for the last chunk's choice
  pass.split_layers = true;  // as prefill's: the last buffer holds the rest of the step (the slots' rows)
  ForwardPass head;  // the MTP head's rows, as prefill's
  if (p.images) f.rope_positions = bind_images(*p.images, q, uint32_t(q.position), rows, pass, head);
  if (!embeds()) encode_step_rows(enc, io_row, rows, true);
  encode_prefill_rows(enc, pass, head, p.last, p.sampling);
  if (!has_head()) encode_step_rows(enc, io_row, rows, false);
  const int end = q.position + int(rows);
  // The head's last row pairs with ids[end], the next chunk's first id, not written yet: a
  // defined id meanwhile (a stale one would make the row depend on what the slot held before).
  if (mtp_ && !p.last) host_ids(p.slot)[end] = 0;
  if (p.snapshot) f.snapshot = encode_snapshot(enc, p.slot, end);
  f.prompt_slot = p.slot;
  q.generated_from = end;
  q.logprob_position = p.sampling.logprobs >= 0 ? end : -1;
  q.position = end;  // counted now; a failed wait resets the slot
}

void Engine::commit_shared_step(const std::vector<SlotStep>& steps, const BeforeChoice& before_choice,
                                const PromptChunk* prompt) {
  if (steps.empty() || steps.size() > size_t(options_.max_sequences))
    throw EngineError("[engine] step takes 1.." + std::to_string(options_.max_sequences) + " slots, got " +
                      std::to_string(steps.size()));
  if (unaccepted_)
    throw EngineError("[engine] step: the last shared step waits for the head's outcome (step_accept first)");
  if (!range_.whole(model_.dims) && options_.max_sequences < 2)
    throw EngineError(
        "[engine] step: an engine of a layer range takes shared steps with max_sequences > 1 (set at "
        "load: its step_rows)");
  if (decoding_) decode_end();
  if (!in_flight_.empty()) {
    if (in_flight_.back().speculative)
      throw EngineError(
          "[engine] step_commit: a step with drafts is in flight (the GPU decides its slots' positions): "
          "step_wait first");
    for (const SlotStep& s : steps)
      if (!s.drafts.empty() || s.mtp_drafts > 0 || s.sampling.token_mask)
        throw EngineError("[engine] step_commit: slot " + std::to_string(s.slot) + ": " +
                          std::to_string(in_flight_.size()) +
                          " steps in flight: drafts and token masks wait for them (step_wait first, or step)");
  }
  if (prompt) check_prompt_chunk(*prompt, steps);
  InFlight f{.kind = "shared step"};
  ForwardPass pass;
  StepSegments& segs = pass.segs;
  std::vector<Sampling> samplings;
  uint32_t rows = 0;
  bool run_head = false;  // an entry asked for MTP drafts: the head runs over the step's rows
  for (const SlotStep& s : steps) {
    for (uint32_t i = 0; i < segs.count; ++i)
      if (segs.seg[i].slot == uint32_t(s.slot))
        throw EngineError("[engine] step: slot " + std::to_string(s.slot) + " is listed twice");
    check_slot_step(s, rows);
    const uint32_t n = 1 + step_drafts(s);
    run_head |= s.mtp_drafts > 0;
    segs.seg[segs.count++] = {.slot = uint32_t(s.slot),
                              .first_row = rows,
                              .rows = n,
                              .position = uint32_t(sequences_[size_t(s.slot)].position)};
    samplings.push_back(s.sampling);
    f.logprobs.push_back(s.sampling.logprobs);
    rows += n;
    f.speculative |= n > 1;
  }
  // Drafts go after each slot's chosen token (ids[position]); the verify rows read them there.
  for (const SlotStep& s : steps) {
    auto* ids = static_cast<uint32_t*>(ws_->ids.host(s.slot));
    std::memcpy(ids + sequences_[size_t(s.slot)].position + 1, s.drafts.data(), s.drafts.size() * 4);
    write_logit_bias(s.slot, s.sampling);
  }
  if (run_head) write_head_tail(segs);

  Encoder enc(*device_, kernels_, "shared step");
  if (prompt) encode_prompt_chunk(enc, *prompt, f, rows);  // its rows first: the slots' pass reuses the workspace
  for (uint32_t i = 0; i < segs.count; ++i)  // MTP drafts into ids after the chosen token, one slot at a time
    if (steps[i].mtp_drafts > 0 && steps[i].drafts.empty() && segs.seg[i].rows > 1)
      encode_mtp_drafts(enc, steps[i].slot, int(segs.seg[i].position), segs.seg[i].rows - 1);
  pass.rows = rows;
  pass.matvec = true;
  pass.snapshot_rows = f.speculative ? uint32_t(options_.max_draft) : 0;  // each segment keeps its first rows - 1
  if (!embeds()) encode_step_rows(enc, 0, rows, true);
  encode_forward(enc, pass);
  if (mtp_ && !run_head) encode_mtp_cache_gap(enc, segs);
  if (!has_head()) {  // the rows go on to the next engine; the head chooses (step_accept)
    encode_step_rows(enc, 0, rows, false);
    f.segs = segs;
    f.buffers = commit(enc);
    push_in_flight(std::move(f));
    for (uint32_t i = 0; i < segs.count; ++i) sequences_[segs.seg[i].slot].position += 1;
    return;
  }
  // Slots with penalties, logprobs or logit_bias choose as a decode step does (penalty counts
  // are per step, so one at a time); the others as verify rows, all together; masked slots last.
  StepSegments verified{};
  std::vector<Sampling> verified_samplings;
  f.verified_index.assign(steps.size(), MQ_MAX_SEGMENTS);
  std::vector<uint32_t> masked;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const Sampling& s = samplings[i];
    if (s.token_mask) {
      masked.push_back(i);
    } else if (s.penalised() || s.logprobs >= 0 || s.constrained()) {
      encode_choice(enc, int(segs.seg[i].slot), segs.seg[i].first_row, s, segs.seg[i].position + 1);
    } else {
      f.verified_index[i] = verified.count;
      verified.seg[verified.count++] = segs.seg[i];
      verified_samplings.push_back(s);
    }
  }
  if (verified.count) encode_verification(enc, verified, verified_samplings);
  if (!masked.empty()) {
    try {
      encode_masked_choices(enc, segs, samplings, masked, before_choice);
    } catch (...) {
      if (f.prompt_slot >= 0) {  // its state holds the chunk's rows, its position too: it starts over
        ws_->clear_state(f.prompt_slot);
        sequences_[size_t(f.prompt_slot)] = Sequence{};
      }
      throw;
    }
  }
  if (run_head) {
    // The head over every row (pairs with the drafts and the next tokens), then each slot's
    // carry: the row of its last accepted draft (as verify_mtp's).
    encode_mtp(enc, segs, rows, mtp_trunk_hidden(), uint32_t(model_.dims.hidden), rows);
    for (uint32_t i = 0; i < segs.count; ++i) {
      const StepSegment& g = segs.seg[i];
      const Arg accepted(ws_->accepted, size_t(f.verified_index[i]) * 4);  // rows > 1: a verified segment
      encode_mtp_carry(enc, int(g.slot), g.first_row, g.rows > 1 ? &accepted : nullptr, g.rows, i > 0);
    }
  }
  f.segs = segs;
  f.buffers = commit(enc);
  counters_.pipelined_steps += !in_flight_.empty();
  push_in_flight(std::move(f));
  // Each slot fed its chosen token; accepted drafts are counted when the step is waited for.
  for (uint32_t i = 0; i < segs.count; ++i) {
    Sequence& q = sequences_[segs.seg[i].slot];
    q.position += 1;
    q.mtp_carry = run_head;
  }
}

std::vector<std::vector<uint32_t>> Engine::step_wait() {
  if (in_flight_.empty() || decoding_)
    throw EngineError("[engine] step_wait: no shared step in flight (step_commit first)");
  return finish_shared_step(wait_oldest());
}

std::vector<std::vector<uint32_t>> Engine::finish_shared_step(const InFlight& f) {
  if (!has_head()) {  // nothing chosen here: the positions wait for step_accept
    unaccepted_ = Unaccepted{.segs = f.segs};
    for (uint32_t i = 0; i < f.segs.count; ++i) sequences_[f.segs.seg[i].slot].logprob_position = -1;
    return std::vector<std::vector<uint32_t>>(f.segs.count);
  }
  // Only a speculative step reads ws_->accepted: nothing was committed behind it to overwrite it.
  const auto* accepted = static_cast<const uint32_t*>(ws_->accepted->contents());
  std::vector<std::vector<uint32_t>> out;
  for (uint32_t i = 0; i < f.segs.count; ++i) {
    const StepSegment& g = f.segs.seg[i];
    Sequence& q = sequences_[g.slot];
    const uint32_t a = f.speculative && f.verified_index[i] < MQ_MAX_SEGMENTS ? accepted[f.verified_index[i]] : 0;
    const auto* ids = static_cast<const uint32_t*>(ws_->ids.host(int(g.slot)));
    out.emplace_back(ids + g.position + 1, ids + g.position + 2 + a);  // accepted drafts, then the next token
    q.position += int(a);
    q.logprob_position = f.logprobs[i] >= 0 ? int(g.position) + 1 : -1;
    count_verified(g.rows - 1, a);
  }
  counters_.verify_steps += f.speculative;
  return out;
}

}  // namespace mq::engine
