// One forward pass, in the order of the model's math: embed, then per layer input norm ->
// mixer (Gated DeltaNet or gated attention) -> post norm -> MLP (dense or MoE, mlp.cpp), then
// the final norm and lm_head. The pass (engine.h: ForwardPass) says which rows of which slots,
// on which kernels, and which logits; choosing the next token follows (choice.cpp).
#include <algorithm>
#include <utility>

#include "dflash.h"

namespace mq::engine {
namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// "layers 0-7 and after": the part of a prefill step a command buffer holds.
std::string layer_range(size_t first, size_t end, size_t layers) {
  const std::string range = end - first > 1 ? "s " + std::to_string(first) + "-" + std::to_string(end - 1)
                                            : " " + std::to_string(first);
  return "layer" + range + (end == layers ? " and after" : "");
}

}  // namespace

void Engine::encode_forward(Encoder& enc, const ForwardPass& pass) {
  const ModelDims& d = model_.dims;
  const uint32_t H = uint32_t(d.hidden), V = uint32_t(d.vocab), rows = pass.rows;
  // Each segment's rows from its own ids; an engine that does not embed finds its rows in x.
  for (uint32_t i = 0; i < pass.segs.count && embeds(); ++i) {
    const StepSegment& s = pass.segs.seg[i];
    encode_embed(enc, ws_->ids.part(int(s.slot)), s.position, s.rows, Arg(ws_->x, size_t(s.first_row) * H * 4), i > 0);
  }
  encode_embed_rows(enc, pass.embed_rows, ws_->x);
  // Layer i's input norm also adds layer i-1's MLP output to the residual stream. A prefill
  // step commits a command buffer every prefill_layers_per_buffer layers (macOS pre-empts a
  // buffer that holds the GPU too long); its last one also holds everything after the layers.
  const size_t n = layers_.size(), per = pass.split_layers ? size_t(options_.prefill_layers_per_buffer) : n;
  for (size_t i = 0; i < n; ++i) {
    if (i % per == 0 && per < n) {
      if (i > 0) enc.split();
      enc.name_part(layer_range(i, std::min(i + per, n), n));
    }
    encode_layer(enc, pass, layers_[i], i > 0);
    if (dflash_) encode_dflash_capture(enc, pass, i);
  }
  if (!has_head()) {  // the next engine's first layer reads x + mix as its input
    const ResidualAddParams rp{.n = rows * H};
    enc.dispatch_threads(*k_.residual_add, {ws_->x, ws_->mix, Arg::value(rp)}, {ceil_div(rows * H, 4), 1});
    return;
  }
  // The final norm, fused into the lm_head when every row's logits are wanted.
  const Norm final_norm{final_norm_, *k_.final_norm};
  if (pass.logit_row0 == 0) {
    encode_normed_projections(enc, pass.matvec, final_norm, true, {{&lm_head_, ws_->logits, V}}, rows);
  } else {
    encode_norm(enc, final_norm, rows, true, ws_->mix);
    if (pass.logit_row0 < rows)
      encode_projection(enc, pass.matvec, lm_head_, Arg(ws_->xn, size_t(pass.logit_row0) * H * 4), H, ws_->logits, V,
                        rows - pass.logit_row0);
  }
  if (dflash_) encode_dflash_context(enc, pass);
}

void Engine::encode_embed(Encoder& enc, const Arg& ids, uint32_t first, uint32_t rows, const Arg& out, bool overlap) {
  const uint32_t H = uint32_t(model_.dims.hidden), V = uint32_t(model_.dims.vocab);
  const QuantEmbedParams ep{.dim = H, .vocab = V, .first = first, .rows = rows};
  enc.dispatch(*embed_.kernels.embed,
               {at(embed_.weight), scales_of(embed_), biases_of(embed_), ids, out, Arg::value(ep)},
               {ceil_div(H, MQ_EMBED_THREADS * MQ_QUANT_BLOCK), rows}, {MQ_EMBED_THREADS}, overlap);
}

// Copies of 32-bit words (the f32 features as they are), after the embeddings they replace.
void Engine::encode_embed_rows(Encoder& enc, const std::vector<ForwardPass::EmbedRows>& rows, const Arg& out) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  for (size_t i = 0; i < rows.size(); ++i) {
    const ForwardPass::EmbedRows& e = rows[i];
    const CopyParams p{
        .cols = H, .rows = e.rows, .src_offset = 0, .src_stride = H, .dst_offset = e.row * H, .dst_stride = H};
    enc.dispatch_threads(*k_.copy_u32, {e.src, out, Arg::value(p)}, {H, e.rows}, i > 0);
  }
}

void Engine::encode_layer(Encoder& enc, const ForwardPass& pass, const LayerWeights& l, bool add_mix) {
  const LayerKernels& k = l.kernels;
  const Norm input_norm{l.input_norm, add_mix ? *k.input_norm_residual : *k.input_norm};
  if (l.delta) encode_deltanet(enc, pass, l, input_norm, add_mix);
  else encode_attention(enc, pass, l, input_norm, add_mix);
  const Norm post_norm{l.post_norm, *k.post_norm_residual};
  if (l.moe) encode_moe_mlp(enc, pass.matvec, *l.moe, post_norm, pass.rows);
  else encode_mlp(enc, pass.matvec, *l.mlp, pass.rows, uint32_t(model_.dims.intermediate), &post_norm);
}

// Gated DeltaNet: the four input projections, then conv + gates + scan + the gated norm but its
// per-head factor, in SIMD-groups that never wait for each other (shaders/deltanet.metal), then
// out_proj into mix. Matvec steps' rows fit the history ring beside the positions they read, so
// the scan stores them and out_proj applies the factor as it loads its input: one barrier.
// Prefill steps apply it and store the ring in a second stage. A verify step keeps the state
// after each draft row for its rollback (pass.snapshot_rows).
void Engine::encode_deltanet(Encoder& enc, const ForwardPass& pass, const LayerWeights& l, const Norm& input_norm,
                             bool add_mix) {
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const DeltaNetWeights& m = *l.delta;
  const LayerKernels& k = l.kernels;
  const SlotStrides& strides = w.slot_strides;
  const uint32_t H = uint32_t(d.hidden), D = MQ_DELTA_HEAD_DIM, rows = pass.rows;
  const uint32_t nk = uint32_t(d.lin_k_heads), nv = uint32_t(d.lin_v_heads), C = 2 * nk * D + nv * D;
  encode_normed_projections(
      enc, pass.matvec, input_norm, add_mix,
      {{&m.in_proj_qkv, w.qkv_raw, C}, {&m.in_proj_z, w.z, nv * D}, {&m.in_proj_b, w.b, nv}, {&m.in_proj_a, w.a, nv}},
      rows);
  const uint32_t slots = history_slots(d, options_), ss_stride = nv * MQ_DELTA_HEAD_PARTIALS;
  const Arg state_snaps = pass.snapshot_rows ? Arg(l.state_snaps.buffer) : Arg(w.no_snapshots);
  const DeltaScanParams sp{.n_k = nk,
                           .n_v = nv,
                           .ksize = uint32_t(d.conv_kernel),
                           .hist_slots = slots,
                           .snap_rows = pass.snapshot_rows,
                           .store_history = pass.matvec ? 1u : 0u,
                           .x_stride = C,
                           .ab_stride = nv,
                           .z_stride = nv * D,
                           .ss_stride = ss_stride,
                           .state_snap_stride = strides.state_words,
                           .state_slot_stride = strides.state_words,
                           .hist_slot_stride = strides.history_words,
                           .snap_slot_stride = strides.snapshot_words,
                           .norm_f32 = m.norm.desc->dtype == "F32" ? 1u : 0u,
                           .qk_eps = 1e-6f};
  const uint32_t scan_groups = ceil_div(nv * (D / MQ_DELTA_SCAN_ROWS), k.conv_scan->threads / MQ_SIMD_WIDTH);
  enc.dispatch(*k.conv_scan,
               {w.qkv_raw, at(m.conv1d), l.hist.buffer, w.a, w.b, at(m.a_log), at(m.dt_bias), w.z, at(m.norm),
                l.state.buffer, w.delta_out, w.head_ss, state_snaps, Arg::value(pass.segs), Arg::value(sp)},
               {scan_groups, pass.segs.count});
  if (pass.matvec) {
    const QmvHeadNormParams op{.in_dim = nv * D,
                               .out_dim = m.out_proj.out,
                               .rows = rows,
                               .x_stride = nv * D,
                               .y_stride = H,
                               .ss_stride = ss_stride,
                               .eps = d.eps};
    const QmvVariant& v = m.out_proj.kernels.qmv_head_norm;
    enc.dispatch(v.pipeline(rows),
                 {at(m.out_proj.weight), scales_of(m.out_proj), biases_of(m.out_proj), w.delta_out, w.head_ss, w.mix,
                  Arg::value(op)},
                 {v.threadgroups(m.out_proj.out, rows)}, {MQ_QMV_THREADS});
  } else {
    const DeltaNormParams np{.n_k = nk,
                             .n_v = nv,
                             .hist_slots = slots,
                             .x_stride = C,
                             .ss_stride = ss_stride,
                             .hist_slot_stride = strides.history_words,
                             .norm_eps = d.eps};
    enc.dispatch(*k.norm_history,
                 {w.qkv_raw, w.head_ss, w.delta_out, l.hist.buffer, Arg::value(pass.segs), Arg::value(np)},
                 {nv + C / D, pass.segs.count});
    encode_projection(enc, false, m.out_proj, w.delta_out, nv * D, w.mix, H, rows);
  }
}

// Gated attention: q (with its gate), k, v projections, the attention itself, then o_proj into mix.
void Engine::encode_attention(Encoder& enc, const ForwardPass& pass, const LayerWeights& l, const Norm& input_norm,
                              bool add_mix) {
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const AttentionWeights& m = *l.attn;
  const uint32_t H = uint32_t(d.hidden), HD = MQ_ATTN_HEAD_DIM, nq = uint32_t(d.heads), nkv = uint32_t(d.kv_heads);
  const uint32_t q_stride = nq * 2 * HD, kv_stride = nkv * HD;
  encode_normed_projections(enc, pass.matvec, input_norm, add_mix,
                            {{&m.q_proj, w.q, q_stride}, {&m.k_proj, w.k, kv_stride}, {&m.v_proj, w.v, kv_stride}},
                            pass.rows);
  if (pass.matvec) encode_attention_decode(enc, pass, l);
  else encode_attention_prefill(enc, pass, l);
  encode_projection(enc, pass.matvec, m.o_proj, w.attn, nq * HD, w.mix, H, pass.rows);
}

// Flash-decode with the q/k norm, RoPE and K/V append inside (no prep dispatch, no barrier
// between append and read); the context is split across threadgroups to give every GPU core a
// few, then merged by the combine. Per segment: row groups of per_group rows, and splits from
// its own context only (decode_splits), so a sequence's bits do not depend on what it is
// batched with.
void Engine::encode_attention_decode(Encoder& enc, const ForwardPass& pass, const LayerWeights& l) {
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const AttentionWeights& m = *l.attn;
  const StepSegments& segs = pass.segs;
  const uint32_t HD = MQ_ATTN_HEAD_DIM, nq = uint32_t(d.heads), nkv = uint32_t(d.kv_heads), rep = nq / nkv;
  const bool one_row_each = std::all_of(segs.seg, segs.seg + segs.count,
                                        [](const StepSegment& g) { return g.rows == 1; });
  const uint32_t per_group = one_row_each ? 1 : 4;
  const Pipeline& decode = one_row_each ? *l.kernels.attn_decode_r1 : *l.kernels.attn_decode_r4;
  // A SIMD-group per query head; a threadgroup serves `heads` of a kv head's rep.
  const uint32_t heads = decode.threads / MQ_SIMD_WIDTH;
  const uint32_t head_groups = nkv * ceil_div(rep, heads);
  AttnDecodeParams ap{.nq = nq,
                      .nkv = nkv,
                      .q_stride = nq * 2 * HD,
                      .k_stride = nkv * HD,
                      .v_stride = nkv * HD,
                      .out_stride = nq * HD,
                      .max_ctx = uint32_t(options_.max_context),
                      .cache_slot_bytes = w.slot_strides.cache_bytes,
                      .n_splits = 1,
                      .split_len = {},
                      .eps = d.eps,
                      .rope_delta = {}};
  uint32_t row_groups = 0;
  for (uint32_t i = 0; i < segs.count; ++i) {
    const uint32_t context = segs.seg[i].position + segs.seg[i].rows;
    const uint32_t splits = decode_splits(context, head_groups, device_->gpu_cores(), w.max_splits);
    ap.split_len[i] = ceil_div(context, splits);
    ap.n_splits = std::max(ap.n_splits, ceil_div(context, ap.split_len[i]));
    row_groups += ceil_div(segs.seg[i].rows, per_group);
    ap.rope_delta[i] = sequences_[segs.seg[i].slot].rope_delta;
  }
  enc.dispatch(decode,
               {w.q, w.k, w.v, at(m.q_norm), at(m.k_norm), w.rope_turns, l.k_cache.buffer, l.v_cache.buffer, w.part_o,
                w.part_ms, w.attn, Arg::value(segs), Arg::value(ap)},
               {ap.n_splits, head_groups, row_groups}, {heads * MQ_SIMD_WIDTH});
  if (ap.n_splits > 1)
    enc.dispatch(*k_.attn_combine, {w.q, w.part_o, w.part_ms, w.attn, Arg::value(segs), Arg::value(ap)},
                 {nq, pass.rows});
}

// A prep dispatch (q/k norms, RoPE, K/V append), then prefill attention over the slot's cache.
// Prefill passes hold one sequence: their kernels take its slot's part of the caches.
void Engine::encode_attention_prefill(Encoder& enc, const ForwardPass& pass, const LayerWeights& l) {
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const AttentionWeights& m = *l.attn;
  const LayerKernels& k = l.kernels;
  const uint32_t HD = MQ_ATTN_HEAD_DIM, nq = uint32_t(d.heads), nkv = uint32_t(d.kv_heads), rep = nq / nkv;
  const uint32_t rows = pass.rows, pos = pass.segs.seg[0].position, max_ctx = uint32_t(options_.max_context);
  const int slot = int(pass.segs.seg[0].slot);
  const AttnPrepParams pp{.rows = rows,
                          .nq = nq,
                          .nkv = nkv,
                          .q_stride = nq * 2 * HD,
                          .k_stride = nkv * HD,
                          .v_stride = nkv * HD,
                          .pos_base = pos,
                          .max_ctx = max_ctx,
                          .eps = d.eps,
                          .rope_delta = sequences_[size_t(slot)].rope_delta,
                          .has_rope_pos = pass.rope_positions.buffer ? 1u : 0u,
                          .mrope_h_end = 3 * uint32_t(d.mrope_section[1]),
                          .mrope_w_end = 3 * uint32_t(d.mrope_section[2])};
  const Arg rope_positions = pass.rope_positions.buffer ? pass.rope_positions : Arg(w.no_snapshots);
  const uint32_t prep_threads = k.attn_prep->threads;  // one SIMD-group per (row, head)
  enc.dispatch(*k.attn_prep,
               {w.q, w.k, w.v, at(m.q_norm), at(m.k_norm), w.rope_turns, l.k_cache.part(slot), l.v_cache.part(slot),
                Arg::value(pp), rope_positions},
               {ceil_div(rows * (nq + 2 * nkv), prep_threads / MQ_SIMD_WIDTH)}, {prep_threads});
  const AttnParams ap{.rows = rows,
                      .nq = nq,
                      .nkv = nkv,
                      .q_stride = nq * 2 * HD,
                      .out_stride = nq * HD,
                      .pos_base = pos,
                      .max_ctx = max_ctx};
  // Each SIMD-group owns 8 rows of one query head; a threadgroup all rep heads of a
  // kv head for 8 * rb rows, or, when they do not fit, `max_sg` of them for 8 rows.
  const uint32_t max_sg = k.attn_prefill->threads / MQ_SIMD_WIDTH;
  const uint32_t rb = rep <= max_sg ? std::max(1u, std::min(max_sg / rep, ceil_div(rows, 8))) : 1;
  const uint32_t sg = rep <= max_sg ? rep * rb : max_sg;
  enc.dispatch(*k.attn_prefill, {w.q, l.k_cache.part(slot), l.v_cache.part(slot), w.attn, Arg::value(ap)},
               {ceil_div(rows, 8 * rb), nkv * ceil_div(rep, sg / rb)}, {sg * MQ_SIMD_WIDTH});
}

}  // namespace mq::engine
