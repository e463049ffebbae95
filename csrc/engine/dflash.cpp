// The DFlash drafter (math: dflash.h): its weights and caches, the capture of the target's hidden
// states inside every forward pass, their projection into the context caches, and a block pass.
#include "dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mq::engine {
namespace {

const std::string kDflash = "dflash.";

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

uint64_t cache_bytes_per_layer(const DrafterDims& d, const EngineOptions& o) {
  return uint64_t(o.max_context) * uint64_t(d.kv_heads) * uint64_t(d.head_dim) * 4;
}

}  // namespace

uint64_t dflash_cache_bytes(const DrafterDims& d, const EngineOptions& o) {
  return 2 * uint64_t(d.layers) * cache_bytes_per_layer(d, o) * uint64_t(o.max_sequences);
}

uint64_t dflash_workspace_bytes(const DrafterDims& d, const EngineOptions& o) {
  const uint64_t H = uint64_t(d.hidden), n = d.target_layer_ids.size(), kv = uint64_t(d.kv_heads) * d.head_dim;
  const uint64_t per_row = n * H + 2 * H + 2 * kv + 3 * H + 2 * uint64_t(d.heads) * d.head_dim + 3 * d.intermediate;
  return per_row * rows_per_step(o) * 4;
}

void Engine::load_dflash() {
  const DrafterDims& d = model_.drafter;
  const ModelDims& t = model_.dims;
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw EngineError("[engine] DFlash drafter: " + what);
  };
  need(range_.whole(t), "needs the whole model (not a layer range)");
  need(d.hidden == t.hidden,
       "hidden size " + std::to_string(d.hidden) + " != the target's " + std::to_string(t.hidden));
  need(d.head_dim % 64 == 0 && d.head_dim <= MQ_DFLASH_MAX_HEAD_DIM, "head_dim " + std::to_string(d.head_dim) +
                                                                         " (kernels take multiples of 64 up to " +
                                                                         std::to_string(MQ_DFLASH_MAX_HEAD_DIM) + ")");
  need(d.kv_heads > 0 && d.heads % d.kv_heads == 0, "heads must be a multiple of kv heads");
  need(d.mask_token_id >= 0 && d.mask_token_id < t.vocab, "mask_token_id outside the vocabulary");
  need(!d.target_layer_ids.empty(), "no target layers");
  for (int id : d.target_layer_ids)
    need(id >= 0 && id < t.layers, "target layer " + std::to_string(id) + " outside the target's layers");
  dflash_ = std::make_unique<DflashWeights>();
  DflashWeights& w = *dflash_;
  w.dims = d;
  w.fc = weights_.linear(kDflash + "fc");
  w.hidden_norm = weights_.tensor(kDflash + "hidden_norm.weight");
  w.norm = weights_.tensor(kDflash + "norm.weight");
  const size_t cache = cache_bytes_per_layer(d, options_);
  std::vector<std::shared_ptr<gpu::Buffer>> made;
  for (int i = 0; i < d.layers; ++i) {
    const std::string p = kDflash + "layers." + std::to_string(i) + ".";
    DflashLayer l;
    l.input_norm = weights_.tensor(p + "input_layernorm.weight");
    l.post_norm = weights_.tensor(p + "post_attention_layernorm.weight");
    l.q_norm = weights_.tensor(p + "self_attn.q_norm.weight");
    l.k_norm = weights_.tensor(p + "self_attn.k_norm.weight");
    need(l.q_norm.desc->dtype == l.k_norm.desc->dtype, p + "self_attn: q_norm and k_norm must share a dtype");
    l.q_proj = weights_.linear(p + "self_attn.q_proj");
    l.k_proj = weights_.linear(p + "self_attn.k_proj");
    l.v_proj = weights_.linear(p + "self_attn.v_proj");
    l.o_proj = weights_.linear(p + "self_attn.o_proj");
    l.mlp = {weights_.linear(p + "mlp.gate_proj"), weights_.linear(p + "mlp.up_proj"),
             weights_.linear(p + "mlp.down_proj")};
    l.k_cache = new_slot_buffer(*device_, cache, options_.max_sequences);
    l.v_cache = new_slot_buffer(*device_, cache, options_.max_sequences);
    made.push_back(l.k_cache.buffer);
    made.push_back(l.v_cache.buffer);
    w.layers.push_back(std::move(l));
  }
  const size_t R = ws_->max_rows, H = size_t(d.hidden), kv = size_t(d.kv_heads) * d.head_dim;
  const size_t qd = size_t(d.heads) * d.head_dim, I = size_t(d.intermediate);
  // Each scratch buffer and its floats per row (dflash_workspace_bytes counts the same).
  using Rows = std::shared_ptr<gpu::Buffer> DflashWeights::*;
  const std::pair<Rows, size_t> scratch[] = {{&DflashWeights::hidden, d.target_layer_ids.size() * H},
                                             {&DflashWeights::ctx_raw, H},
                                             {&DflashWeights::ctx, H},
                                             {&DflashWeights::k, kv},
                                             {&DflashWeights::v, kv},
                                             {&DflashWeights::x, H},
                                             {&DflashWeights::xn, H},
                                             {&DflashWeights::mix, H},
                                             {&DflashWeights::q, qd},
                                             {&DflashWeights::attn, qd},
                                             {&DflashWeights::gate, I},
                                             {&DflashWeights::up, I},
                                             {&DflashWeights::act, I}};
  for (const auto& [buffer, cols] : scratch) w.*buffer = made.emplace_back(device_->new_buffer(R * cols * 4));
  device_->make_resident(made);
}

// After layers_[layer] of a pass: its output (x + mix) into the capture columns of each id naming it.
void Engine::encode_dflash_capture(Encoder& enc, const ForwardPass& pass, size_t layer) {
  const DflashWeights& w = *dflash_;
  const std::vector<int>& ids = w.dims.target_layer_ids;
  const uint32_t H = uint32_t(w.dims.hidden), n = uint32_t(ids.size());
  for (uint32_t i = 0; i < n; ++i) {
    if (size_t(ids[i]) != layer) continue;
    const DflashCaptureParams p{.dim = H, .rows = pass.rows, .out_stride = n * H, .col0 = i * H};
    enc.dispatch_threads(*w.capture, {ws_->x, ws_->mix, w.hidden, Arg::value(p)}, {H, pass.rows});
  }
}

// Layer l's `nq` query heads (in place in w.q; 0: none) and its key heads normed and rotated, keys and
// values (w.k, w.v) appended to its context caches at the segments' slots and positions.
void Engine::encode_dflash_prep(Encoder& enc, const DflashLayer& l, const StepSegments& segs, uint32_t nq,
                                uint32_t rows) {
  const DflashWeights& w = *dflash_;
  const DrafterDims& d = w.dims;
  const uint32_t hd = uint32_t(d.head_dim), nkv = uint32_t(d.kv_heads);
  const DflashPrepParams pp{.nq = nq,
                            .nkv = nkv,
                            .head_dim = hd,
                            .q_stride = nq * hd,
                            .kv_stride = nkv * hd,
                            .slot_floats = uint32_t(l.k_cache.slot_bytes / 4),
                            .eps = d.eps,
                            .log2_theta = float(std::log2(double(d.rope_theta)))};
  enc.dispatch(*l.prep,
               {w.q, w.k, w.v, at(l.q_norm), at(l.k_norm), l.k_cache.buffer, l.v_cache.buffer, Arg::value(segs),
                Arg::value(pp)},
               {nq + nkv, rows}, {MQ_DFLASH_THREADS});
}

// The pass's captured rows into every draft layer's context cache at their slots and positions.
void Engine::encode_dflash_context(Encoder& enc, const ForwardPass& pass) {
  const DflashWeights& w = *dflash_;
  const DrafterDims& d = w.dims;
  const uint32_t H = uint32_t(d.hidden), rows = pass.rows, n = uint32_t(d.target_layer_ids.size());
  const uint32_t kv = uint32_t(d.kv_heads * d.head_dim);
  const bool matvec = rows <= max_step_rows();
  encode_projection(enc, matvec, w.fc, w.hidden, n * H, w.ctx_raw, H, rows);
  const RmsNormParams np{.dim = H, .x_stride = H, .r_stride = H, .y_stride = H, .eps = d.eps};
  enc.dispatch(*w.hidden_norm_kernel, {w.ctx_raw, at(w.hidden_norm), w.ctx, Arg::value(np)}, {rows});
  for (const DflashLayer& l : w.layers) {
    encode_projection(enc, matvec, l.k_proj, w.ctx, H, w.k, kv, rows);
    encode_projection(enc, matvec, l.v_proj, w.ctx, H, w.v, kv, rows, true);
    encode_dflash_prep(enc, l, pass.segs, 0, rows);
  }
}

// A block of `rows` rows at `position` of `slot`: ids[position + 1 ..] = mask, the layers, then the
// drafts' logits into ws_->logits rows [0, rows - 1) and their argmax into ids[position + 1 ..].
void Engine::encode_dflash_block(Encoder& enc, int slot, int position, uint32_t rows) {
  const DflashWeights& w = *dflash_;
  const DrafterDims& d = w.dims;
  const uint32_t H = uint32_t(d.hidden), V = uint32_t(model_.dims.vocab), I = uint32_t(d.intermediate);
  const uint32_t hd = uint32_t(d.head_dim), nq = uint32_t(d.heads), nkv = uint32_t(d.kv_heads);
  const uint32_t p = uint32_t(position), kv = nkv * hd, qd = nq * hd;
  const bool matvec = rows <= max_step_rows();
  const FillParams fp{
      .cols = rows - 1, .rows = 1, .dst_offset = p + 1, .dst_stride = 0, .value_bits = uint32_t(d.mask_token_id)};
  enc.dispatch_threads(*w.fill_u32, {ids(slot), Arg::value(fp)}, {rows - 1, 1});
  encode_embed(enc, ids(slot), p, rows, w.x);
  const ForwardPass block = ForwardPass::one_slot(slot, position, rows, matvec);
  const RmsNormParams np{.dim = H, .x_stride = H, .r_stride = H, .y_stride = H, .eps = d.eps};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DflashLayer& l = w.layers[i];
    // xn = rms(x (+ the previous layer's output)) * input_norm
    if (i == 0) enc.dispatch(*l.input_norm_first, {w.x, at(l.input_norm), w.xn, Arg::value(np)}, {rows});
    else enc.dispatch(*l.input_norm_residual, {w.x, w.mix, at(l.input_norm), w.xn, Arg::value(np)}, {rows});
    encode_projection(enc, matvec, l.q_proj, w.xn, H, w.q, qd, rows);
    encode_projection(enc, matvec, l.k_proj, w.xn, H, w.k, kv, rows, true);
    encode_projection(enc, matvec, l.v_proj, w.xn, H, w.v, kv, rows, true);
    encode_dflash_prep(enc, l, block.segs, nq, rows);
    const DflashAttentionParams ap{.nq = nq,
                                   .nkv = nkv,
                                   .head_dim = hd,
                                   .n_keys = p + rows,
                                   .q_stride = qd,
                                   .out_stride = qd,
                                   .scale = 1.0f / std::sqrt(float(hd))};
    enc.dispatch(*w.attention, {w.q, l.k_cache.part(slot), l.v_cache.part(slot), w.attn, Arg::value(ap)}, {nq, rows},
                 {MQ_DFLASH_THREADS});
    encode_projection(enc, matvec, l.o_proj, w.attn, qd, w.mix, H, rows);
    // x += attention; xn = rms(x) * post_norm; mix = down(silu(gate(xn)) * up(xn))
    enc.dispatch(*l.post_norm_residual, {w.x, w.mix, at(l.post_norm), w.xn, Arg::value(np)}, {rows});
    encode_projection(enc, matvec, l.mlp.gate_proj, w.xn, H, w.gate, I, rows);
    encode_projection(enc, matvec, l.mlp.up_proj, w.xn, H, w.up, I, rows, true);
    const SiluMulParams sp{.n = I, .rows = rows, .gate_stride = I, .up_stride = I, .out_stride = I};
    enc.dispatch_threads(*k_.silu_mul, {w.gate, w.up, w.act, Arg::value(sp)}, {ceil_div(I, 4), rows});
    encode_projection(enc, matvec, l.mlp.down_proj, w.act, I, w.mix, H, rows);
  }
  enc.dispatch(*w.final_norm_kernel, {w.x, w.mix, at(w.norm), w.xn, Arg::value(np)}, {rows});
  encode_projection(enc, matvec, lm_head_, Arg(w.xn, size_t(H) * 4), H, ws_->logits, V, rows - 1);
  encode_argmax(enc, ws_->logits, rows - 1, ids(slot), p + 1);
}

std::vector<float> Engine::dflash_hidden(uint32_t rows) const {
  if (!dflash_) throw EngineError("[engine] dflash_hidden: no DFlash drafter loaded");
  if (rows > ws_->max_rows)
    throw EngineError("[engine] dflash_hidden: at most " + std::to_string(ws_->max_rows) + " rows");
  const size_t n = size_t(rows) * dflash_->dims.target_layer_ids.size() * size_t(dflash_->dims.hidden);
  const float* h = static_cast<const float*>(dflash_->hidden->contents());
  return std::vector<float>(h, h + n);
}

std::vector<float> Engine::dflash_block(int slot, uint32_t k) {
  if (!dflash_) throw EngineError("[engine] dflash_block: no DFlash drafter loaded");
  Sequence& q = sequence(slot, "dflash_block: ");
  if (k < 1 || k + 1 > ws_->max_rows)
    throw EngineError("[engine] dflash_block: k must be in 1.." + std::to_string(ws_->max_rows - 1));
  if (q.position == 0) throw EngineError("[engine] dflash_block: the slot has no context (prefill first)");
  decode_end();
  check_room(size_t(k) + 1, q);
  Encoder enc(*device_, kernels_, "DFlash block");
  encode_dflash_block(enc, slot, q.position, k + 1);
  commit_and_wait(enc, "DFlash block", slot);
  const float* l = static_cast<const float*>(ws_->logits->contents());
  return std::vector<float>(l, l + size_t(k) * size_t(model_.dims.vocab));
}

}  // namespace mq::engine
