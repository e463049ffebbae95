// The MTP head's weights, its step encoding and Engine::mtp_logits (math and sources: mtp.h).
#include "mtp.h"

#include <algorithm>
#include <cstring>

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

void Engine::encode_mtp(Encoder& enc, uint32_t rows, int position, const Arg& hidden, uint32_t hidden_stride,
                        uint32_t logit_row0) {
  const MtpWeights& m = *mtp_;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(model_.dims.hidden);
  const float eps = model_.dims.eps;
  // Draft and verify-sized calls stream the weights once (matvec); longer ones take GEMM tiles.
  matvec_ = rows <= kMaxVerifyRows;
  // e = embed(ids[position + 1 + r]) into mix (free: the trunk's last MLP output is in x by now).
  encode_embed(enc, ids(), uint32_t(position) + 1, rows, w.mix);
  // mtp_in [rows][2H] = [rms(e) * pre_fc_norm_embedding | rms(h) * pre_fc_norm_hidden]: both halves
  // of one row side by side, so fc is one projection over 2H (two half-width projections
  // accumulated would round differently from the reference's single matmul).
  const RmsNormParams pe{H, H, H, 2 * H, eps}, ph{H, hidden_stride, H, 2 * H, eps};
  enc.dispatch(*m.norm_embedding, {w.mix, at(m.pre_fc_norm_embedding), w.mtp_in, Arg::value(pe)}, {rows});
  enc.dispatch(*m.norm_hidden, {hidden, at(m.pre_fc_norm_hidden), Arg(w.mtp_in, size_t(H) * 4), Arg::value(ph)}, {rows},
               {m.norm_hidden->threads}, true);
  // u = fc(mtp_in) is the MTP layer's residual stream x; then the layer as the trunk's.
  encode_projection(enc, m.fc, w.mtp_in, 2 * H, w.x, H, rows);
  encode_layer(enc, m.layer, one_segment(rows, position), false);
  // mtp_hidden = mtp.norm(x + mix): the head's output state, kept for a chained call.
  const RmsNormParams pn{H, H, H, H, eps};
  enc.dispatch(*m.norm_residual, {w.x, w.mix, at(m.norm), w.mtp_hidden, Arg::value(pn)},
               {rows});
  if (logit_row0 < rows) encode_mtp_logits(enc, logit_row0, rows);
}

// Into ws_->logits: callers encode the MTP after the trunk's logits were consumed (by the
// choice in the same command buffer, or read back by the CPU before this one runs).
void Engine::encode_mtp_logits(Encoder& enc, uint32_t row0, uint32_t rows) {
  const uint32_t H = uint32_t(model_.dims.hidden), V = uint32_t(model_.dims.vocab);
  encode_projection(enc, lm_head_, Arg(ws_->mtp_hidden, size_t(row0) * H * 4), H, ws_->logits, V, rows - row0);
}

// Prefill fills the MTP cache for the prompt: the chunk's rows [position(), position() + rows)
// pair with ids[position() + 1 ..]; the last row of the final chunk with the id the choice
// just wrote (ids[end]). No MTP logits: the logits buffer holds the trunk's, for the caller.
void Engine::encode_mtp_prefill_chunk(Encoder& enc, uint32_t rows) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  const Arg hidden = options_.mtp_hidden == MtpHidden::pre_norm ? Arg(ws_->x) : Arg(ws_->xn);
  encode_mtp(enc, rows, seq_->position, hidden, H, rows);
}

std::vector<float> Engine::mtp_logits(const std::vector<uint32_t>& ids) {
  if (!mtp_) throw EngineError("[engine] mtp_logits: no MTP head loaded");
  if (ids.size() < 2) throw EngineError("[engine] mtp_logits needs at least two token ids");
  const uint32_t V = uint32_t(model_.dims.vocab), H = uint32_t(model_.dims.hidden);
  for (uint32_t t : ids)
    if (t >= V) throw EngineError("[engine] token id " + std::to_string(t) + " is outside the vocabulary");
  reset();
  check_room(ids.size());
  std::memcpy(host_ids(), ids.data(), ids.size() * 4);
  std::vector<float> logits;
  logits.reserve((ids.size() - 1) * V);
  for (size_t done = 0; done < ids.size();) {
    const uint32_t rows = uint32_t(std::min<size_t>(ws_->max_rows, ids.size() - done));
    const uint32_t heads = uint32_t(std::min<size_t>(rows, ids.size() - 1 - done));  // the last id has no next
    Encoder enc(*device_, kernels_, "MTP logits chunk");
    encode_step(enc, rows, rows, nullptr, true);  // the trunk: no logits, no choice
    // Named now: x is the buffer holding the residual stream at this point of the encoding.
    const Arg hidden = options_.mtp_hidden == MtpHidden::pre_norm ? Arg(ws_->x) : Arg(ws_->xn);
    if (heads > 0) encode_mtp(enc, heads, seq_->position, hidden, H, 0);
    Submitted step = commit(enc);
    try {
      wait(step);
    } catch (const gpu::GpuError& e) {
      throw step_failed("MTP logits chunk", {slot_}, e);
    }
    const float* l = static_cast<const float*>(ws_->logits->contents());
    logits.insert(logits.end(), l, l + size_t(heads) * V);
    seq_->position += int(rows);
    done += rows;
  }
  reset();  // the MTP cache lacks the last row: nothing may continue from here
  return logits;
}

}  // namespace mq::engine
