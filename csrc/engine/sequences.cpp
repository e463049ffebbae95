// A sequence slot's life: its position and token ids, prefill in chunks and pipelined decode
// steps (each step's forward pass is forward.cpp's; verify steps: speculative.cpp; several
// slots in one step: batch.cpp; snapshots: snapshot.cpp).
#include <algorithm>
#include <cstring>
#include <deque>

#include "mtp.h"
#include "workspace.h"

namespace mq::engine {

Arg Engine::ids(int slot) const { return ws_->ids.part(slot); }
uint32_t* Engine::host_ids(int slot) const { return static_cast<uint32_t*>(ws_->ids.host(slot)); }

void Engine::reset(int slot) {
  Sequence& q = sequence(slot);
  decode_end();
  ws_->clear_state(slot);
  q = Sequence{};
}

std::vector<uint32_t> Engine::tokens(int slot) const {
  const Sequence& q = sequence(slot);
  const auto* ids = host_ids(slot);
  return std::vector<uint32_t>(ids, ids + q.position);
}

uint32_t Engine::chosen(int slot) const { return host_ids(slot)[sequence(slot).position]; }

std::vector<float> Engine::prefill(int slot, const std::vector<uint32_t>& tokens, const Sampling& sampling,
                                   bool all_logits, bool last_logits, const PrefillProgress& progress,
                                   const std::vector<int>& snapshot_at,
                                   std::vector<std::shared_ptr<Snapshot>>* snapshots, const PromptImages* images,
                                   std::optional<uint32_t> next_token) {
  Sequence& q = sequence(slot);
  decode_end();
  if (tokens.empty()) throw EngineError("[engine] prefill needs at least one token");
  if (!has_head() && (all_logits || last_logits))
    throw EngineError("[engine] prefill: an engine up to layer " + std::to_string(range_.end) +
                      " computes no logits (the last layer's engine does)");
  if (!embeds() && tokens.size() > ws_->max_rows)
    throw EngineError("[engine] prefill of " + std::to_string(tokens.size()) + " tokens: an engine from layer " +
                      std::to_string(range_.first) + " takes one chunk of input rows per call (at most " +
                      std::to_string(ws_->max_rows) + ")");
  if (images) check_images(*images, q, tokens.size(), "prefill");
  check_sampling(sampling);
  write_logit_bias(slot, sampling);
  // One slot past the last token receives the chosen next token.
  check_room(tokens.size() + 1, q);
  const uint32_t vocab = uint32_t(model_.dims.vocab);
  for (uint32_t t : tokens)
    if (t >= vocab) throw EngineError("[engine] token id " + std::to_string(t) + " is outside the vocabulary");
  if (next_token && *next_token >= vocab)
    throw EngineError("[engine] next token id " + std::to_string(*next_token) + " is outside the vocabulary");
  std::memcpy(host_ids(slot) + q.position, tokens.data(), tokens.size() * 4);

  const int end = q.position + int(tokens.size());
  if (next_token) host_ids(slot)[end] = *next_token;
  q.generated_from = end;
  q.logprob_position = sampling.logprobs >= 0 && !next_token ? end : -1;  // the choice's entry (ring slot end)
  for (size_t i = 0; i < snapshot_at.size(); ++i)
    if (snapshot_at[i] <= q.position || snapshot_at[i] > end || (i > 0 && snapshot_at[i] <= snapshot_at[i - 1]))
      throw EngineError("[engine] snapshot positions must ascend within (" + std::to_string(q.position) + ", " +
                        std::to_string(end) + "]");
  auto next_snapshot = snapshot_at.begin();
  // The chunks' rotary positions on the device, kept until every chunk has been waited for.
  std::vector<std::shared_ptr<gpu::Buffer>> rope_positions;

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
      throw step_failed("prefill chunk", {slot}, e);
    }
  };
  for (size_t done = 0; done < tokens.size();) {
    // A chunk ends at the next snapshot position, so the state there can be copied.
    size_t limit = tokens.size() - done;
    if (next_snapshot != snapshot_at.end()) limit = std::min<size_t>(limit, *next_snapshot - q.position);
    const uint32_t rows = uint32_t(std::min<size_t>(ws_->max_rows, limit));
    const bool last = done + rows == tokens.size();
    ForwardPass pass = ForwardPass::one_slot(slot, q.position, rows, false);
    pass.logit_row0 = all_logits ? 0 : last ? rows - 1 : rows;
    pass.split_layers = true;
    ForwardPass head;  // the MTP head's rows: the same positions, features of the tokens one further
    if (images) rope_positions.push_back(bind_images(*images, q, uint32_t(q.position), rows, pass, head));
    Encoder enc(*device_, kernels_, "prefill chunk");
    encode_prefill_rows(enc, pass, head, last && !next_token, sampling);
    if (next_snapshot != snapshot_at.end() && *next_snapshot == q.position + int(rows)) {
      if (snapshots) snapshots->push_back(encode_snapshot(enc, slot, *next_snapshot));
      ++next_snapshot;
    }
    in_flight.push_back(commit(enc));
    q.position += int(rows);  // counted now; a failed wait below resets the slot
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
      logits.insert(logits.end(), l, l + size_t(rows - pass.logit_row0) * vocab);
    }
  }
  settle(0);
  return logits;
}

void Engine::encode_prefill_rows(Encoder& enc, const ForwardPass& pass, const ForwardPass& head, bool last,
                                 const Sampling& sampling) {
  const int slot = int(pass.segs.seg[0].slot);
  const uint32_t rows = pass.rows;
  Sequence& q = sequences_[size_t(slot)];
  encode_forward(enc, pass);
  if (last) encode_choice(enc, slot, rows - 1 - pass.logit_row0, sampling, uint32_t(q.position) + rows);
  if (mtp_) {
    encode_mtp_prefill_chunk(enc, slot, rows, head);
    // After the last chunk: the pair of the last prompt token and the chosen one.
    if (last) encode_mtp_carry(enc, slot, rows - 1, nullptr, 1, false);
    q.mtp_carry = last;
  }
}

void Engine::check_images(const PromptImages& images, const Sequence& q, size_t tokens,
                          const std::string& where) const {
  const size_t prompt = images.rope_positions.size() / 3, end = size_t(q.position) + tokens;
  if (images.rope_positions.size() % 3 || prompt < end)
    throw EngineError("[engine] " + where + ": " + std::to_string(images.rope_positions.size()) +
                      " rotary position components (3 per prompt row from row 0) for rows up to " +
                      std::to_string(end));
  const size_t row_bytes = size_t(model_.dims.hidden) * 4;
  for (const PromptImages::Features& f : images.features) {
    if (size_t(f.first) + f.rows > prompt)
      throw EngineError("[engine] " + where + ": image rows [" + std::to_string(f.first) + ", " +
                        std::to_string(f.first + f.rows) + ") are past the prompt's " + std::to_string(prompt) +
                        " rows");
    if (!f.features || f.offset + f.rows * row_bytes > f.features->size())
      throw EngineError("[engine] " + where + ": the features of image rows from " + std::to_string(f.first) +
                        " hold fewer than " + std::to_string(f.rows) + " rows of " + std::to_string(row_bytes) +
                        " bytes (f32 [rows][hidden])");
  }
}

std::shared_ptr<gpu::Buffer> Engine::bind_images(const PromptImages& images, Sequence& q, uint32_t first, uint32_t rows,
                                                 ForwardPass& pass, ForwardPass& head) {
  auto positions = device_->new_buffer(size_t(rows) * 3 * 4);
  const int32_t* from = images.rope_positions.data() + size_t(first) * 3;
  std::memcpy(positions->contents(), from, size_t(rows) * 3 * 4);
  pass.rope_positions = head.rope_positions = Arg(positions);
  pass.embed_rows = image_rows(images, first, rows);
  head.embed_rows = image_rows(images, first + 1, rows);  // the head embeds the token one further
  // The largest rotary position so far, from the rows before (text at row + delta) and these.
  int high = int(first) - 1 + q.rope_delta;
  for (size_t i = 0; i < size_t(rows) * 3; ++i) high = std::max(high, from[i]);
  q.rope_delta = high + 1 - int(first + rows);
  return positions;
}

std::vector<ForwardPass::EmbedRows> Engine::image_rows(const PromptImages& images, uint32_t first, uint32_t rows) {
  std::vector<ForwardPass::EmbedRows> out;
  const size_t row_bytes = size_t(model_.dims.hidden) * 4;
  for (const PromptImages::Features& f : images.features) {
    const uint32_t from = std::max(first, f.first), to = std::min(first + rows, f.first + f.rows);
    if (from < to) out.push_back({from - first, to - from, Arg(f.features, f.offset + (from - f.first) * row_bytes)});
  }
  return out;
}

void Engine::decode_begin(int slot, int max_tokens, const Sampling& sampling) {
  Sequence& q = sequence(slot);
  decode_end();
  if (!range_.whole(model_.dims) && max_tokens > 2)
    throw EngineError("[engine] decode_begin: an engine of layers [" + std::to_string(range_.first) + ", " +
                      std::to_string(range_.end) + ") takes one step per decode (max_tokens 2, got " +
                      std::to_string(max_tokens) + "): each waits for rows or a choice from another engine");
  q.mtp_carry = false;  // decode steps do not run the MTP head
  check_sampling(sampling);
  // One step (max_tokens 2: the chosen token, then the step) reads the mask the host wrote before.
  if (sampling.token_mask && max_tokens > 2)
    throw EngineError(
        "[engine] decode steps take no token mask beyond one step (each step's mask follows the token before "
        "it): step the slot instead, or decode_begin(max_tokens=2) with the step's mask written");
  write_logit_bias(slot, sampling);  // read by every step in flight: not written again until decode_end
  q.logprob_position = -1;
  decoding_.emplace();
  decoding_->slot = slot;
  decoding_->sampling = sampling;
  decoding_->max_tokens = max_tokens;
}

void Engine::commit_decode_step() {
  Decoding& d = *decoding_;
  Sequence& q = sequences_[size_t(d.slot)];
  check_room(2, q);
  Encoder enc(*device_, kernels_, "decode step");
  InFlight step{.kind = "decode step"};
  step.segs = ForwardPass::one_slot(d.slot, q.position, 1, true).segs;
  encode_forward(enc, ForwardPass::one_slot(d.slot, q.position, 1, true));
  encode_choice(enc, d.slot, 0, d.sampling, uint32_t(q.position) + 1);
  step.buffers = commit(enc);
  push_in_flight(std::move(step));
  q.position += 1;
  d.committed += 1;
  counters_.tokens_decoded += 1;
}

void Engine::push_in_flight(InFlight step) {
  in_flight_.push_back(std::move(step));
  counters_.max_steps_in_flight = std::max<uint64_t>(counters_.max_steps_in_flight, in_flight_.size());
}

Engine::InFlight Engine::wait_oldest() {
  InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  try {
    wait(step.buffers);
  } catch (const gpu::GpuError& e) {
    throw step_failed(step.kind, step.slots(), e);  // with every step queued behind it
  }
  return step;
}

std::optional<uint32_t> Engine::decode_next() {
  if (!decoding_) throw EngineError("[engine] decode_next without decode_begin");
  Decoding& d = *decoding_;
  if (d.returned >= d.max_tokens) return std::nullopt;
  Sequence& q = sequences_[size_t(d.slot)];
  const auto* ids = host_ids(d.slot);
  const int steps = d.max_tokens - 1;  // the last token is returned, never fed
  if (d.committed < steps) commit_decode_step();
  int returned_position;
  if (d.returned == 0) {  // the token prefill (or the last decode) chose
    returned_position = q.position - d.committed;
  } else {
    returned_position = int(wait_oldest().segs.seg[0].position) + 1;
  }
  d.returned += 1;
  q.logprob_position = d.sampling.logprobs >= 0 ? returned_position : -1;
  return ids[returned_position];
}

std::optional<TokenLogprobs> Engine::last_logprobs(int slot) const {
  const Sequence& q = sequence(slot);
  if (q.logprob_position < 0) return std::nullopt;
  // The step that wrote this ring slot was waited for; the ones in flight write other slots.
  const auto* entry = static_cast<const uint32_t*>(ws_->logprobs.host(slot)) +
                      size_t(q.logprob_position % MQ_LOGPROB_SLOTS) * MQ_LOGPROB_ENTRY_WORDS;
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
  while (!in_flight_.empty()) {
    InFlight step = wait_oldest();
    if (!decoding_) finish_shared_step(step);  // its tokens stay fed; nobody asked for them
  }
  decoding_.reset();
}

}  // namespace mq::engine
