// The MTP head's weights, its step encoding and Engine::mtp_logits (math and sources: mtp.h).
#include "mtp.h"

#include <algorithm>
#include <cstring>

#include "layer_tensors.h"

namespace mq::engine {
namespace {

const std::string kMtp = "mtp.";

}  // namespace

void Engine::load_mtp() {
  if (!model_.tensors.count(kMtp + "fc.weight"))
    throw EngineError("[engine] mtp: the checkpoint description has no MTP head (mtp.* tensors)");
  mtp_ = std::make_unique<MtpWeights>();
  MtpWeights& m = *mtp_;
  m.pre_fc_norm_embedding = weights_.tensor(kMtp + "pre_fc_norm_embedding.weight");
  m.pre_fc_norm_hidden = weights_.tensor(kMtp + "pre_fc_norm_hidden.weight");
  m.fc = weights_.linear(kMtp + "fc");
  m.norm = weights_.tensor(kMtp + "norm.weight");
  m.layer = load_layer(weights_, model_.dims, kMtp + "layers.0.", true);
  const size_t cache_bytes = kv_cache_bytes(model_.dims, options_);
  m.layer.k_cache = new_slot_buffer(*device_, cache_bytes, options_.max_sequences);
  m.layer.v_cache = new_slot_buffer(*device_, cache_bytes, options_.max_sequences);
  device_->make_resident({m.layer.k_cache.buffer, m.layer.v_cache.buffer});
}

Arg Engine::mtp_trunk_hidden() const { return options_.mtp_hidden == MtpHidden::pre_norm ? Arg(ws_->x) : Arg(ws_->xn); }

void Engine::encode_mtp(Encoder& enc, int slot, uint32_t rows, int position, const Arg& hidden, uint32_t hidden_stride,
                        uint32_t logit_row0, const ForwardPass* images) {
  encode_mtp(enc, ForwardPass::one_slot(slot, position, rows, true).segs, rows, hidden, hidden_stride, logit_row0,
             images);
}

void Engine::encode_mtp(Encoder& enc, const StepSegments& segs, uint32_t rows, const Arg& hidden,
                        uint32_t hidden_stride, uint32_t logit_row0, const ForwardPass* images) {
  const MtpWeights& m = *mtp_;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(model_.dims.hidden);
  const float eps = model_.dims.eps;
  // Draft and verify-sized calls stream the weights once (matvec); longer ones take GEMM tiles,
  // as do rows with their own rotary positions (only the prefill attention takes those).
  const bool positioned = images && images->rope_positions.buffer;
  ForwardPass pass;
  pass.segs = segs;
  pass.rows = rows;
  pass.matvec = rows <= max_step_rows() && !positioned;
  if (positioned) pass.rope_positions = images->rope_positions;
  // e = embed(ids[position + 1 + r]) into mix (free: the trunk's last MLP output is in x by now),
  // image features over the rows that embed image-pad tokens.
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    encode_embed(enc, ids(int(g.slot)), g.position + 1, g.rows, Arg(w.mix, size_t(g.first_row) * H * 4), i > 0);
  }
  if (images) encode_embed_rows(enc, images->embed_rows, w.mix);
  // mtp_in [rows][2H] = [rms(e) * pre_fc_norm_embedding | rms(h) * pre_fc_norm_hidden]: both halves
  // of one row side by side, so fc is one projection over 2H (two half-width projections
  // accumulated would round differently from the reference's single matmul).
  const RmsNormParams pe{.dim = H, .x_stride = H, .r_stride = H, .y_stride = 2 * H, .eps = eps};
  const RmsNormParams ph{.dim = H, .x_stride = hidden_stride, .r_stride = H, .y_stride = 2 * H, .eps = eps};
  enc.dispatch(*m.norm_embedding, {w.mix, at(m.pre_fc_norm_embedding), w.mtp_in, Arg::value(pe)}, {rows});
  enc.dispatch(*m.norm_hidden, {hidden, at(m.pre_fc_norm_hidden), Arg(w.mtp_in, size_t(H) * 4), Arg::value(ph)}, {rows},
               {m.norm_hidden->threads}, true);
  // u = fc(mtp_in) is the MTP layer's residual stream x; then the layer as the trunk's.
  encode_projection(enc, pass.matvec, m.fc, w.mtp_in, 2 * H, w.x, H, rows);
  encode_layer(enc, pass, m.layer, false);
  // mtp_hidden = mtp.norm(x + mix): the head's output state, kept for a chained call.
  const RmsNormParams pn{.dim = H, .x_stride = H, .r_stride = H, .y_stride = H, .eps = eps};
  enc.dispatch(*m.norm_residual, {w.x, w.mix, at(m.norm), w.mtp_hidden, Arg::value(pn)}, {rows});
  if (logit_row0 < rows)
    encode_mtp_logits(enc, pass.matvec, Arg(w.mtp_hidden, size_t(logit_row0) * H * 4), rows - logit_row0);
}

// Into ws_->logits: callers encode the MTP after the trunk's logits were consumed (by the
// choice in the same command buffer, or read back by the CPU before this one runs).
void Engine::encode_mtp_logits(Encoder& enc, bool matvec, const Arg& hidden, uint32_t rows) {
  const uint32_t H = uint32_t(model_.dims.hidden), V = uint32_t(model_.dims.vocab);
  encode_projection(enc, matvec, lm_head_, hidden, H, ws_->logits, V, rows);
}

void Engine::encode_mtp_carry(Encoder& enc, int slot, uint32_t row, const Arg* accepted, uint32_t planes,
                              bool overlap) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  const Arg from(ws_->mtp_hidden, size_t(row) * H * 4);
  if (accepted) {  // the row is decided on the GPU: delta_restore copies the plane it names
    const DeltaRestoreParams p{.state_floats = H, .state_snap_stride = H, .planes = planes};
    enc.dispatch_threads(*k_.delta_restore, {ws_->mtp_carry.part(slot), from, *accepted, Arg::value(p)}, {H / 4},
                         overlap);
  } else {
    const CopyParams p{.cols = H, .rows = 1, .src_offset = 0, .src_stride = 0, .dst_offset = 0, .dst_stride = 0};
    enc.dispatch_threads(*k_.copy_u32, {from, ws_->mtp_carry.part(slot), Arg::value(p)}, {H, 1}, overlap);
  }
}

// Prefill fills the MTP cache for the prompt: the chunk's rows [position, position + rows)
// pair with ids[position + 1 ..]; the last row of the final chunk with the id the choice
// just wrote (ids[end]). No MTP logits: the logits buffer holds the trunk's, for the caller.
// With images, `head` holds the head's rows' rotary positions (the trunk rows') and the image
// features of the tokens they embed (prompt rows one further on).
void Engine::encode_mtp_prefill_chunk(Encoder& enc, int slot, uint32_t rows, const ForwardPass& head) {
  encode_mtp(enc, slot, rows, sequences_[size_t(slot)].position, mtp_trunk_hidden(), uint32_t(model_.dims.hidden), rows,
             &head);
}

// Draft i (at ids[p + i]) is the argmax of the head's logits for the pair one position before
// it; one row at a time, so the head's weights and the lm_head stream once per draft (matvec).
void Engine::encode_mtp_drafts(Encoder& enc, int slot, int position, uint32_t k) {
  const uint32_t H = uint32_t(model_.dims.hidden), p = uint32_t(position);
  const Arg carry = ws_->mtp_carry.part(slot);
  encode_mtp_logits(enc, true, carry, 1);
  encode_argmax(enc, ws_->logits, 1, ids(slot), p + 1);
  for (uint32_t i = 2; i <= k; ++i) {
    // The pair (the head's last output, draft i - 1) at position p + i - 2; one row, into mtp_hidden row 0.
    encode_mtp(enc, slot, 1, int(p + i - 2), i == 2 ? carry : Arg(ws_->mtp_hidden), H, 0);
    encode_argmax(enc, ws_->logits, 1, ids(slot), p + i);
  }
}

// A step without the head leaves its positions' cache rows as they were (drafts made ahead there,
// an older sequence's rows, never-written memory), which the head's later passes read: zeros
// instead, the same whatever the slot held. f16: [ctx][kv_dim] halves; q8: [ctx][kv_dim] bytes,
// then [ctx][kv_dim / MQ_ATTN_Q8_BLOCK] f16 scales.
void Engine::encode_mtp_cache_gap(Encoder& enc, const StepSegments& segs) {
  const MtpWeights& m = *mtp_;
  const uint32_t kv_dim = uint32_t(model_.dims.kv_heads) * MQ_ATTN_HEAD_DIM, ctx = uint32_t(options_.max_context);
  const bool q8 = options_.kv_bits == 8;
  const uint32_t row_words = q8 ? kv_dim / 4 : kv_dim / 2, scale_words = kv_dim / MQ_ATTN_Q8_BLOCK / 2;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const StepSegment& g = segs.seg[i];
    for (const SlotBuffer* cache : {&m.layer.k_cache, &m.layer.v_cache}) {
      const Arg dst = cache->part(int(g.slot));
      const FillParams rows{
          .cols = row_words, .rows = g.rows, .dst_offset = g.position * row_words, .dst_stride = row_words};
      enc.dispatch_threads(*m.fill_u32, {dst, Arg::value(rows)}, {row_words, g.rows});
      if (!q8) continue;
      const FillParams scales{.cols = scale_words,
                              .rows = g.rows,
                              .dst_offset = ctx * row_words + g.position * scale_words,
                              .dst_stride = scale_words};
      enc.dispatch_threads(*m.fill_u32, {dst, Arg::value(scales)}, {scale_words, g.rows});
    }
  }
}

std::vector<float> Engine::mtp_logits(int slot, const std::vector<uint32_t>& ids) {
  if (!mtp_) throw EngineError("[engine] mtp_logits: no MTP head loaded");
  if (ids.size() < 2) throw EngineError("[engine] mtp_logits needs at least two token ids");
  const uint32_t V = uint32_t(model_.dims.vocab), H = uint32_t(model_.dims.hidden);
  for (uint32_t t : ids)
    if (t >= V) throw EngineError("[engine] token id " + std::to_string(t) + " is outside the vocabulary");
  reset(slot);
  Sequence& q = sequences_[size_t(slot)];
  check_room(ids.size(), q);
  std::memcpy(host_ids(slot), ids.data(), ids.size() * 4);
  std::vector<float> logits;
  logits.reserve((ids.size() - 1) * V);
  for (size_t done = 0; done < ids.size();) {
    const uint32_t rows = uint32_t(std::min<size_t>(ws_->max_rows, ids.size() - done));
    const uint32_t heads = uint32_t(std::min<size_t>(rows, ids.size() - 1 - done));  // the last id has no next
    Encoder enc(*device_, kernels_, "MTP logits chunk");
    ForwardPass trunk = ForwardPass::one_slot(slot, q.position, rows, false);
    trunk.logit_row0 = rows;  // no logits, no choice
    trunk.split_layers = true;
    encode_forward(enc, trunk);
    if (heads > 0) encode_mtp(enc, slot, heads, q.position, mtp_trunk_hidden(), H, 0);
    commit_and_wait(enc, "MTP logits chunk", slot);
    const float* l = static_cast<const float*>(ws_->logits->contents());
    logits.insert(logits.end(), l, l + size_t(heads) * V);
    q.position += int(rows);
    done += rows;
  }
  reset(slot);  // the MTP cache lacks the last row: nothing may continue from here
  return logits;
}

}  // namespace mq::engine
