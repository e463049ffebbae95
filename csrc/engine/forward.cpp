// One forward step, encoded into one command buffer, in the order of the model's
// math (docs/design.md, "The model"): embed, then per layer norm -> mixer (attention or
// Gated DeltaNet) -> residual + norm -> MLP, then final norm, lm_head, next token.
#include <algorithm>
#include <utility>

#include "workspace.h"

namespace mq::engine {
namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// The norm-fused kernels' parameters, members aside: h = x (+ mix), written to x_next (then the
// residual stream: Engine::encode_normed_projections swaps the two) and xn as encode_norm leaves them.
QmvNormParams qmv_norm_params(const ModelDims& dims, const DeviceTensor& norm, bool add_mix, uint32_t rows) {
  QmvNormParams p{};
  p.in_dim = uint32_t(dims.hidden);
  p.rows = rows;
  p.x_stride = p.in_dim;
  p.flags = MQ_QMV_WRITE_XN | (add_mix ? MQ_QMV_ADD_MIX | MQ_QMV_WRITE_H : 0) |
            (norm.desc->dtype == "F32" ? MQ_QMV_NORM_F32 : 0);
  p.eps = dims.eps;
  return p;
}

}  // namespace

void Engine::encode_projection(Encoder& enc, const QuantLinear& l, const Arg& x, uint32_t x_stride, const Arg& y,
                               uint32_t y_stride, uint32_t rows, bool overlap) {
  const QuantMatmulParams p{l.in, l.out, rows, x_stride, y_stride};
  if (matvec_) {
    // One row streams the weights at full width; 2..8 verify rows share one stream.
    const QmvVariant& v = l.kernels.qmv;
    enc.dispatch(v.pipeline(rows), {at(l.weight), scales_of(l), biases_of(l), x, y, Arg::value(p)},
                 {v.threadgroups(l.out)}, {MQ_QMV_THREADS}, overlap);
  } else {
    enc.dispatch(*l.kernels.qmm, {at(l.weight), scales_of(l), biases_of(l), x, y, Arg::value(p)},
                 {ceil_div(rows, MQ_QMM_TILE_ROWS), ceil_div(l.out, MQ_QMM_TILE_OUT)}, {MQ_QMM_THREADS}, overlap);
  }
}

void Engine::encode_norm(Encoder& enc, const Norm& norm, uint32_t rows, bool add_residual,
                         const std::shared_ptr<gpu::Buffer>& residual) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  const RmsNormParams p{H, H, H, H, model_.dims.eps};
  if (add_residual)
    enc.dispatch(norm.kernel, {ws_->x, residual, at(norm.weight), ws_->xn, Arg::value(p)}, {rows});
  else
    enc.dispatch(norm.kernel, {ws_->x, at(norm.weight), ws_->xn, Arg::value(p)}, {rows});
}

// y_m = W_m (rms(x (+ mix)) * norm) for every member, x (+ mix) staying the residual stream
// and xn the normed rows. Matvec steps fold the norm into the projections: one dispatch over
// the members' rows when they share a format (else one each, overlapped); prefill steps
// dispatch the norm, then the projections. `overlap` (matvec steps only): the first dispatch
// too runs beside the previous one.
void Engine::encode_normed_projections(Encoder& enc, const Norm& norm, bool add_mix,
                                       std::initializer_list<NormedOutput> members, uint32_t rows, bool overlap) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  Workspace& w = *ws_;
  if (!matvec_) {
    encode_norm(enc, norm, rows, add_mix, w.mix);
    bool first = true;
    for (const NormedOutput& m : members) {
      encode_projection(enc, *m.l, w.xn, H, m.y, m.y_stride, rows, !first);
      first = false;
    }
    return;
  }
  const NormedOutput* begin = members.begin();
  const NormedOutput* end = members.end();
  while (begin != end) {
    // The longest run of members sharing begin's format, up to MQ_QMV_GROUP_MAX: one dispatch.
    const NormedOutput* stop = begin + 1;
    while (stop != end && stop - begin < MQ_QMV_GROUP_MAX && stop->l->format == begin->l->format) ++stop;
    QmvNormParams p = qmv_norm_params(model_.dims, norm.weight, add_mix, rows);
    if (begin != members.begin())  // the first dispatch writes h and xn
      p.flags &= ~uint32_t(MQ_QMV_WRITE_H | MQ_QMV_WRITE_XN);
    p.members = uint32_t(stop - begin);
    std::vector<Arg> wt, sc, bi, y;
    const QmvVariant& v = begin->l->kernels.qmv_norm;  // one R for the whole group (plan_kernels)
    uint32_t groups = 0;
    for (uint32_t m = 0; m < MQ_QMV_GROUP_MAX; ++m) {
      const NormedOutput& o = begin[std::min(m, p.members - 1)];  // slots past the members repeat the last
      wt.push_back(at(o.l->weight));
      sc.push_back(scales_of(*o.l));
      bi.push_back(biases_of(*o.l));
      y.push_back(o.y);
      if (m < p.members) {
        groups += v.threadgroups(o.l->out);
        p.out_dim[m] = o.l->out;
        p.y_stride[m] = o.y_stride;
        p.tg_end[m] = groups;
      }
    }
    enc.dispatch(v.pipeline(rows),
                 {wt[0], wt[1], wt[2], wt[3], sc[0], sc[1], sc[2], sc[3], bi[0], bi[1], bi[2], bi[3], w.x, w.mix,
                  at(norm.weight), w.x_next, w.xn, y[0], y[1], y[2], y[3], Arg::value(p)},
                 {groups}, {MQ_QMV_THREADS}, overlap || begin != members.begin());
    begin = stop;
  }
  // From here on the residual stream is h (encoding order is execution order).
  if (add_mix) std::swap(w.x, w.x_next);
}

void Engine::encode_layer(Encoder& enc, const LayerWeights& l, const StepSegments& segs, bool add_mix) {
  const StepSegment& last = segs.seg[segs.count - 1];
  const uint32_t rows = last.first_row + last.rows;
  // Prefill steps hold one sequence: their kernels take its slot's part of the caches.
  const int slot = int(segs.seg[0].slot), position = int(segs.seg[0].position);
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(d.hidden), D = MQ_DELTA_HEAD_DIM, HD = MQ_ATTN_HEAD_DIM;
  const LayerKernels& k = l.kernels;
  const Norm input_norm{l.input_norm, add_mix ? *k.input_norm_residual : *k.input_norm};
  const SlotStrides& strides = w.slot_strides;
  if (l.delta) {
    const DeltaNetWeights& m = *l.delta;
    const uint32_t nk = uint32_t(d.lin_k_heads), nv = uint32_t(d.lin_v_heads), C = 2 * nk * D + nv * D;
    encode_normed_projections(enc, input_norm, add_mix,
                              {{&m.in_proj_qkv, w.qkv_raw, C}, {&m.in_proj_z, w.z, nv * D}, {&m.in_proj_b, w.b, nv},
                               {&m.in_proj_a, w.a, nv}},
                              rows);
    // Conv + gates + scan + the gated norm but its per-head factor, in SIMD-groups that never
    // wait for each other (shaders/deltanet.metal). Matvec steps' rows fit the history ring
    // beside the positions they read, so the scan stores them and out_proj applies the factor
    // as it loads its input: one barrier. Prefill steps apply it and store the ring in a
    // second stage. A verify step keeps the state after each draft row for its rollback.
    const uint32_t slots = history_slots(d), ss_stride = nv * MQ_DELTA_HEAD_PARTIALS;
    const Arg state_snaps = snap_rows_ ? Arg(l.state_snaps.buffer) : Arg(w.no_snapshots);
    const DeltaScanParams sp{nk, nv, uint32_t(d.conv_kernel), slots, snap_rows_, matvec_ ? 1u : 0u, C, nv, nv * D,
                             ss_stride, strides.state_words, strides.state_words, strides.history_words,
                             strides.snapshot_words, m.norm.desc->dtype == "F32" ? 1u : 0u, 1e-6f};
    const uint32_t scan_groups = ceil_div(nv * (D / MQ_DELTA_SCAN_ROWS), k.conv_scan->threads / MQ_SIMD_WIDTH);
    enc.dispatch(*k.conv_scan,
                 {w.qkv_raw, at(m.conv1d), l.hist.buffer, w.a, w.b, at(m.a_log), at(m.dt_bias), w.z, at(m.norm),
                  l.state.buffer, w.delta_out, w.head_ss, state_snaps, Arg::value(segs), Arg::value(sp)},
                 {scan_groups, segs.count});
    if (matvec_) {
      const QmvHeadNormParams op{nv * D, m.out_proj.out, rows, nv * D, H, ss_stride, d.eps};
      const QmvVariant& v = m.out_proj.kernels.qmv_head_norm;
      enc.dispatch(v.pipeline(rows),
                   {at(m.out_proj.weight), scales_of(m.out_proj), biases_of(m.out_proj), w.delta_out, w.head_ss, w.mix,
                    Arg::value(op)},
                   {v.threadgroups(m.out_proj.out)}, {MQ_QMV_THREADS});
    } else {
      const DeltaNormParams np{nk, nv, slots, C, ss_stride, strides.history_words, d.eps};
      enc.dispatch(*k.norm_history, {w.qkv_raw, w.head_ss, w.delta_out, l.hist.buffer, Arg::value(segs), Arg::value(np)},
                   {nv + C / D, segs.count});
      encode_projection(enc, m.out_proj, w.delta_out, nv * D, w.mix, H, rows);
    }
  } else {
    const AttentionWeights& m = *l.attn;
    const uint32_t nq = uint32_t(d.heads), nkv = uint32_t(d.kv_heads), rep = nq / nkv;
    const uint32_t q_stride = nq * 2 * HD, kv_stride = nkv * HD, pos = uint32_t(position);
    encode_normed_projections(enc, input_norm, add_mix,
                              {{&m.q_proj, w.q, q_stride}, {&m.k_proj, w.k, kv_stride}, {&m.v_proj, w.v, kv_stride}},
                              rows);
    const uint32_t max_ctx = uint32_t(options_.max_context), attn_stride = nq * HD;
    if (matvec_) {
      // Flash-decode with the q/k norm, RoPE and K/V append inside (no prep dispatch, no
      // barrier between append and read); the context is split across threadgroups to give
      // every GPU core a few, then merged by the combine.
      // Per segment: row groups of per_group rows, and splits from its own context only
      // (decode_splits), so a sequence's bits do not depend on what it is batched with.
      const bool one_row_each = std::all_of(segs.seg, segs.seg + segs.count, [](const StepSegment& g) { return g.rows == 1; });
      const uint32_t per_group = one_row_each ? 1 : 4;
      const Pipeline& decode = one_row_each ? *k.attn_decode_r1 : *k.attn_decode_r4;
      // A SIMD-group per query head; a threadgroup serves `heads` of a kv head's rep.
      const uint32_t heads = decode.threads / MQ_SIMD_WIDTH;
      const uint32_t head_groups = nkv * ceil_div(rep, heads);
      AttnDecodeParams ap{nq, nkv, q_stride, kv_stride, kv_stride, attn_stride, max_ctx, strides.cache_bytes, 1, {},
                          d.eps};
      uint32_t row_groups = 0;
      for (uint32_t i = 0; i < segs.count; ++i) {
        const uint32_t context = segs.seg[i].position + segs.seg[i].rows;
        const uint32_t splits = decode_splits(context, head_groups, device_->gpu_cores(), w.max_splits);
        ap.split_len[i] = ceil_div(context, splits);
        ap.n_splits = std::max(ap.n_splits, ceil_div(context, ap.split_len[i]));
        row_groups += ceil_div(segs.seg[i].rows, per_group);
      }
      enc.dispatch(decode,
                   {w.q, w.k, w.v, at(m.q_norm), at(m.k_norm), w.rope_turns, l.k_cache.buffer, l.v_cache.buffer, w.part_o, w.part_ms,
                    w.attn, Arg::value(segs), Arg::value(ap)},
                   {ap.n_splits, head_groups, row_groups}, {heads * MQ_SIMD_WIDTH});
      if (ap.n_splits > 1)
        enc.dispatch(*k_.attn_combine, {w.q, w.part_o, w.part_ms, w.attn, Arg::value(segs), Arg::value(ap)},
                     {nq, rows});
    } else {
      const AttnPrepParams pp{rows, nq, nkv, q_stride, kv_stride, kv_stride, pos, max_ctx, d.eps};
      const uint32_t prep_threads = k.attn_prep->threads;  // one SIMD-group per (row, head)
      enc.dispatch(*k.attn_prep,
                   {w.q, w.k, w.v, at(m.q_norm), at(m.k_norm), w.rope_turns, l.k_cache.part(slot), l.v_cache.part(slot), Arg::value(pp)},
                   {ceil_div(rows * (nq + 2 * nkv), prep_threads / MQ_SIMD_WIDTH)}, {prep_threads});
      const AttnParams ap{rows, nq, nkv, q_stride, attn_stride, pos, max_ctx};
      // Each SIMD-group owns 8 rows of one query head; a threadgroup all rep heads of a
      // kv head for 8 * rb rows, or, when they do not fit, `max_sg` of them for 8 rows.
      const uint32_t max_sg = k.attn_prefill->threads / MQ_SIMD_WIDTH;
      const uint32_t rb = rep <= max_sg ? std::max(1u, std::min(max_sg / rep, ceil_div(rows, 8))) : 1;
      const uint32_t sg = rep <= max_sg ? rep * rb : max_sg;
      enc.dispatch(*k.attn_prefill, {w.q, l.k_cache.part(slot), l.v_cache.part(slot), w.attn, Arg::value(ap)},
                   {ceil_div(rows, 8 * rb), nkv * ceil_div(rep, sg / rb)}, {sg * MQ_SIMD_WIDTH});
    }
    encode_projection(enc, m.o_proj, w.attn, nq * HD, w.mix, H, rows);
  }
  const Norm post_norm{l.post_norm, *k.post_norm_residual};
  if (l.moe)
    encode_moe_mlp(enc, *l.moe, post_norm, rows);
  else
    encode_mlp(enc, *l.mlp, rows, uint32_t(d.intermediate), &post_norm);
}

// act = silu(gate(u)) * up(u), u = rms(x + mix) * norm, as one matvec kernel (qmv_norm_silu; gate
// and up of one format); with `writes_h` it also writes x + mix to x_next and u to xn.
void Engine::encode_normed_gate_up(Encoder& enc, const MlpWeights& m, const Norm& norm, uint32_t rows, uint32_t I,
                                   bool writes_h) {
  Workspace& w = *ws_;
  QmvNormParams p = qmv_norm_params(model_.dims, norm.weight, true, rows);
  if (!writes_h) p.flags &= ~uint32_t(MQ_QMV_WRITE_H | MQ_QMV_WRITE_XN);
  p.members = 1;
  p.out_dim[0] = I;
  p.y_stride[0] = p.tg_end[0] = I;
  const QmvVariant& v = m.gate_proj.kernels.qmv_norm_silu;
  enc.dispatch(v.pipeline(rows),
               {at(m.gate_proj.weight), scales_of(m.gate_proj), biases_of(m.gate_proj), at(m.up_proj.weight),
                scales_of(m.up_proj), biases_of(m.up_proj), w.x, w.mix, at(norm.weight), w.x_next, w.xn, w.act,
                Arg::value(p)},
               {v.threadgroups(2 * I)}, {MQ_QMV_THREADS});  // gate and up rows
}

// mix = down(silu(gate(u)) * up(u)), u = xn, or with `post_norm` u = rms(x + mix) * post_norm
// (x + mix becoming the residual stream). Matvec steps with one gate/up format run gate, up,
// the norm and the activation as one kernel (qmv_norm_silu) and down reads its product.
void Engine::encode_mlp(Encoder& enc, const MlpWeights& m, uint32_t rows, uint32_t I, const Norm* post_norm) {
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(model_.dims.hidden);
  if (post_norm && matvec_ && m.gate_proj.format == m.up_proj.format) {
    encode_normed_gate_up(enc, m, *post_norm, rows, I, true);
    std::swap(w.x, w.x_next);
  } else {
    if (post_norm) {
      encode_normed_projections(enc, *post_norm, true, {{&m.gate_proj, w.gate, I}, {&m.up_proj, w.up, I}}, rows);
    } else {
      encode_projection(enc, m.gate_proj, w.xn, H, w.gate, I, rows);
      encode_projection(enc, m.up_proj, w.xn, H, w.up, I, rows, true);
    }
    const SiluMulParams sm{I, rows, I, I, I};
    enc.dispatch_threads(*k_.silu_mul, {w.gate, w.up, w.act, Arg::value(sm)}, {ceil_div(I, 4), rows});
  }
  encode_projection(enc, m.down_proj, w.act, I, w.mix, H, rows);
}

// mix = sum over the chosen experts e of weight_e * expert_e(xn) + sigmoid(shared_expert_gate(xn)) *
// shared_expert(xn) (shaders/moe.metal). Decode and verify rows gather each (row, expert) pair's
// matvec (encode_moe_mlp_fused where gate/up formats allow); prefill groups the pairs by expert
// on the GPU and runs one GEMM per expert.
void Engine::encode_moe_mlp(Encoder& enc, const MoeWeights& m, const Norm& post_norm, uint32_t rows) {
  if (matvec_ && m.gate_proj.format == m.up_proj.format &&
      m.shared_expert.gate_proj.format == m.shared_expert.up_proj.format)
    return encode_moe_mlp_fused(enc, m, post_norm, rows);
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(d.hidden), E = uint32_t(d.experts), K = uint32_t(d.experts_per_token);
  const uint32_t I = uint32_t(d.moe_intermediate), pairs = rows * K;
  const bool grouped = !matvec_;
  // The post norm with the router and the shared expert's gate; everything after reads xn.
  encode_normed_projections(enc, post_norm, true,
                            {{&m.gate, w.router_logits, E}, {&m.shared_expert_gate, w.shared_gate, 1}}, rows);
  const MoeRouteParams rp{E, K, E, d.norm_top_k ? 1u : 0u};
  enc.dispatch(*k_.moe_route, {w.router_logits, w.route_ids, w.route_weights, Arg::value(rp)}, {rows},
               {MQ_MOE_ROUTE_THREADS});
  encode_mlp(enc, m.shared_expert, rows, uint32_t(d.shared_intermediate));  // into mix

  // y = W_e x for every (row, expert) pair: gathered matvecs, or one GEMM per expert over x grouped by expert.
  auto experts = [&](const QuantLinear& l, const Arg& x, const Arg& y, uint32_t x_pairs, bool overlap) {
    const MoeMatmulParams p{l.in, l.out, E, x_pairs, l.in, l.out};
    if (grouped)  // a token picks an expert at most once: no expert has more than `rows` rows
      enc.dispatch(*l.kernels.moe_qmm,
                   {at(l.weight), scales_of(l), biases_of(l), w.expert_offsets, x, y, Arg::value(p)},
                   {ceil_div(rows, MQ_QMM_TILE_ROWS), ceil_div(l.out, MQ_QMM_TILE_OUT), E}, {MQ_QMM_THREADS}, overlap);
    else
      enc.dispatch(*l.kernels.moe_qmv,
                   {at(l.weight), scales_of(l), biases_of(l), w.route_ids, x, y, Arg::value(p)},
                   {ceil_div(l.out, MQ_QMV_ROWS_PER_THREADGROUP), pairs}, {MQ_QMV_THREADS}, overlap);
  };
  if (grouped) {
    const MoeGroupParams gp{E, pairs};
    enc.dispatch(*k_.moe_group, {w.route_ids, w.expert_offsets, w.expert_order, w.expert_slot, Arg::value(gp)}, {1});
    const MoeGatherParams xp{H, pairs, K, H, H};
    enc.dispatch_threads(*k_.moe_gather_rows, {w.xn, w.expert_order, w.expert_x, Arg::value(xp)}, {H / 4, pairs});
  }
  // Grouped rows are one per pair; otherwise pairs read their token's row of xn.
  const Arg x = grouped ? Arg(w.expert_x) : Arg(w.xn);
  experts(m.gate_proj, x, w.expert_gate, grouped ? 1 : K, false);
  experts(m.up_proj, x, w.expert_up, grouped ? 1 : K, true);
  const SiluMulParams sm{I, pairs, I, I, I};
  enc.dispatch_threads(*k_.silu_mul, {w.expert_gate, w.expert_up, w.expert_act, Arg::value(sm)}, {ceil_div(I, 4), pairs});
  experts(m.down_proj, w.expert_act, w.expert_out, 1, false);
  const MoeCombineParams cp{H, rows, K, grouped ? 1u : 0u, H, H, 1};
  enc.dispatch_threads(*k_.moe_combine, {w.expert_out, w.expert_slot, w.route_weights, w.shared_gate, w.mix, Arg::value(cp)},
                       {H / 4, rows});
}

// The MoE block of a matvec step in three barrier intervals (x, mix in; mix out, x the stream):
//   1. the shared expert's gate/up + silu with the post norm (qmv_norm_silu) into act, beside the
//      post norm's router and shared_expert_gate (qmv_norm), which alone writes h and xn;
//   2. per (row, slot) pair its routing, its expert's gate/up and silu (moe_qmv_route_silu) into
//      expert_act (+ route_ids/weights), beside the shared expert's down into mix;
//   3. the experts' down, weighted, plus the gated shared expert (moe_qmv_combine) into mix.
void Engine::encode_moe_mlp_fused(Encoder& enc, const MoeWeights& m, const Norm& post_norm, uint32_t rows) {
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(d.hidden), E = uint32_t(d.experts), K = uint32_t(d.experts_per_token);
  const uint32_t I = uint32_t(d.moe_intermediate), shared_I = uint32_t(d.shared_intermediate);
  // Encoded first: it reads x, which the router's dispatch leaves alone but the swap renames.
  encode_normed_gate_up(enc, m.shared_expert, post_norm, rows, shared_I, false);
  encode_normed_projections(enc, post_norm, true,
                            {{&m.gate, w.router_logits, E}, {&m.shared_expert_gate, w.shared_gate, 1}}, rows, true);
  const QuantLinear &gate = m.gate_proj, &up = m.up_proj, &down = m.down_proj;
  const MoeRouteSiluParams rp{H, I, E, K, d.norm_top_k ? 1u : 0u, E, H, I};
  enc.dispatch(*gate.kernels.moe_qmv_route_silu,
               {at(gate.weight), scales_of(gate), biases_of(gate), at(up.weight), scales_of(up), biases_of(up),
                w.router_logits, w.xn, w.expert_act, w.route_ids, w.route_weights, Arg::value(rp)},
               {ceil_div(I, MQ_MOE_SILU_ROWS_PER_THREADGROUP), rows * K}, {MQ_QMV_THREADS});
  encode_projection(enc, m.shared_expert.down_proj, w.act, shared_I, w.mix, H, rows, true);
  const MoeCombineQmvParams cp{I, H, E, K, I, 1, H};
  enc.dispatch(*down.kernels.moe_qmv_combine,
               {at(down.weight), scales_of(down), biases_of(down), w.route_ids, w.route_weights, w.expert_act,
                w.shared_gate, w.mix, Arg::value(cp)},
               {ceil_div(H, MQ_QMV_ROWS_PER_THREADGROUP), rows}, {MQ_QMV_THREADS});
}

void Engine::encode_embed(Encoder& enc, const Arg& ids, uint32_t first, uint32_t rows, const Arg& out, bool overlap) {
  const uint32_t H = uint32_t(model_.dims.hidden), V = uint32_t(model_.dims.vocab);
  const QuantEmbedParams ep{H, V, first, rows};
  enc.dispatch(*embed_.kernels.embed,
               {at(embed_.weight), scales_of(embed_), biases_of(embed_), ids, out, Arg::value(ep)},
               {ceil_div(H, MQ_EMBED_THREADS * MQ_QUANT_BLOCK), rows}, {MQ_EMBED_THREADS}, overlap);
}

void Engine::encode_argmax(Encoder& enc, const Arg& logits, uint32_t rows, const Arg& out, uint32_t out_pos) {
  const uint32_t V = uint32_t(model_.dims.vocab);
  const ArgmaxParams p{V, V, ws_->argmax_chunk, ws_->argmax_partials, out_pos};
  enc.dispatch(*k_.argmax_partial, {logits, ws_->partials, Arg::value(p)}, {p.n_partials, rows});
  enc.dispatch(*k_.argmax_final, {ws_->partials, out, Arg::value(p)}, {rows});
}

void Engine::encode_choice(Encoder& enc, uint32_t logit_row, const Sampling& s, uint32_t out_pos) {
  const uint32_t V = uint32_t(model_.dims.vocab);
  const Arg raw(ws_->logits, size_t(logit_row) * V * 4);
  Arg logits = raw;
  if (s.penalised()) {
    // The penalised copy is chosen from; the logits buffer (returned to callers) stays raw.
    const uint32_t generated_from = uint32_t(seq_->generated_from);
    const uint32_t start = s.repetition_penalty != 1.0f ? 0u : std::min(generated_from, out_pos);
    const PenaltyParams pp{V, start, generated_from, out_pos, s.repetition_penalty, s.presence_penalty,
                           s.frequency_penalty};
    if (out_pos > start)
      enc.dispatch_threads(*k_.penalty_count, {ids(), ws_->penalty_counts, Arg::value(pp)}, {out_pos - start});
    enc.dispatch_threads(*k_.penalty_apply, {logits, ws_->penalty_counts, ws_->penalised, Arg::value(pp)}, {V});
    logits = Arg(ws_->penalised);
  }
  if (s.temperature <= 0.0f) {
    encode_argmax(enc, logits, 1, ids(), out_pos);
  } else {
    const SampleParams p{V, V, uint32_t(std::max(s.top_k, 0)), s.top_p, s.temperature, s.min_p,
                         uint32_t(s.seed), uint32_t(s.seed >> 32), out_pos, out_pos, 0, 0};
    enc.dispatch(*k_.sample, {logits, ids(), Arg::value(p), ids()}, {1});
  }
  if (s.logprobs >= 0) {
    // Over the raw row (vLLM's default), once the choice above wrote ids[out_pos].
    const LogprobParams p{V, std::min(uint32_t(s.logprobs), V), out_pos, out_pos % MQ_LOGPROB_SLOTS};
    enc.dispatch(*k_.logprobs, {raw, ids(), ws_->logprobs.part(slot_), Arg::value(p)}, {1});
  }
}

StepSegments Engine::one_segment(uint32_t rows, int position) const {
  StepSegments s{};
  s.count = 1;
  s.seg[0] = {uint32_t(slot_), 0, rows, uint32_t(position)};
  return s;
}

void Engine::encode_step(Encoder& enc, uint32_t rows, uint32_t logit_row0, const Sampling* choose, bool prefill) {
  encode_rows(enc, one_segment(rows, seq_->position), logit_row0, prefill);
  if (choose) encode_choice(enc, rows - 1 - logit_row0, *choose, uint32_t(seq_->position) + rows);
}

void Engine::encode_rows(Encoder& enc, const StepSegments& segs, uint32_t logit_row0, bool prefill) {
  const StepSegment& last = segs.seg[segs.count - 1];
  const uint32_t rows = last.first_row + last.rows;
  matvec_ = !prefill && rows <= kMaxVerifyRows;
  const ModelDims& d = model_.dims;
  const uint32_t H = uint32_t(d.hidden), V = uint32_t(d.vocab);
  for (uint32_t i = 0; i < segs.count; ++i) {  // each segment's rows from its own ids
    const StepSegment& s = segs.seg[i];
    encode_embed(enc, ws_->ids.part(int(s.slot)), s.position, s.rows, Arg(ws_->x, size_t(s.first_row) * H * 4), i > 0);
  }
  // Layer i's input norm also adds layer i-1's MLP output to the residual stream. A prefill
  // step commits a command buffer every prefill_layers_per_buffer layers (macOS pre-empts a
  // buffer that holds the GPU too long); its last one also holds everything after the layers.
  const size_t n = layers_.size(), per = prefill ? size_t(options_.prefill_layers_per_buffer) : n;
  for (size_t i = 0; i < n; ++i) {
    if (i % per == 0 && per < n) {
      if (i > 0) enc.split();
      const size_t end = std::min(i + per, n);
      const std::string range =
          end - i > 1 ? "s " + std::to_string(i) + "-" + std::to_string(end - 1) : " " + std::to_string(i);
      enc.name_part("layer" + range + (end == n ? " and after" : ""));
    }
    encode_layer(enc, layers_[i], segs, i > 0);
  }
  // The final norm, fused into the lm_head when every row's logits are wanted.
  const Norm final_norm{final_norm_, *k_.final_norm};
  if (logit_row0 == 0) {
    encode_normed_projections(enc, final_norm, true, {{&lm_head_, ws_->logits, V}}, rows);
  } else {
    encode_norm(enc, final_norm, rows, true, ws_->mix);
    if (logit_row0 < rows)
      encode_projection(enc, lm_head_, Arg(ws_->xn, size_t(logit_row0) * H * 4), H, ws_->logits, V, rows - logit_row0);
  }
}

}  // namespace mq::engine
