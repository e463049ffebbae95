// The MLP of a layer: dense (and the MoE block's shared expert) or the sparse MoE block
// (shaders/moe.metal), from the residual stream x + mix through the post norm, into mix.
#include <utility>

#include "workspace.h"

namespace mq::engine {
namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

}  // namespace

// mix = down(silu(gate(u)) * up(u)), u = xn, or with `post_norm` u = rms(x + mix) * post_norm
// (x + mix becoming the residual stream). Matvec steps with one gate/up format run gate, up,
// the norm and the activation as one kernel (qmv_norm_silu) and down reads its product.
void Engine::encode_mlp(Encoder& enc, bool matvec, const MlpWeights& m, uint32_t rows, uint32_t I,
                        const Norm* post_norm) {
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(model_.dims.hidden);
  if (post_norm && matvec && m.gate_proj.format == m.up_proj.format) {
    encode_normed_gate_up(enc, m, *post_norm, rows, I, true);
    std::swap(w.x, w.x_next);
  } else {
    if (post_norm) {
      encode_normed_projections(enc, matvec, *post_norm, true, {{&m.gate_proj, w.gate, I}, {&m.up_proj, w.up, I}},
                                rows);
    } else {
      encode_projection(enc, matvec, m.gate_proj, w.xn, H, w.gate, I, rows);
      encode_projection(enc, matvec, m.up_proj, w.xn, H, w.up, I, rows, true);
    }
    const SiluMulParams sm{.n = I, .rows = rows, .gate_stride = I, .up_stride = I, .out_stride = I};
    enc.dispatch_threads(*k_.silu_mul, {w.gate, w.up, w.act, Arg::value(sm)}, {ceil_div(I, 4), rows});
  }
  encode_projection(enc, matvec, m.down_proj, w.act, I, w.mix, H, rows);
}

// mix = sum over the chosen experts e of weight_e * expert_e(xn) + sigmoid(shared_expert_gate(xn)) *
// shared_expert(xn). Decode and verify rows gather each (row, expert) pair's matvec
// (encode_moe_mlp_fused where gate/up formats allow); prefill groups the pairs by expert on the
// GPU and runs one GEMM per expert.
void Engine::encode_moe_mlp(Encoder& enc, bool matvec, const MoeWeights& m, const Norm& post_norm, uint32_t rows) {
  if (matvec && m.gate_proj.format == m.up_proj.format &&
      m.shared_expert.gate_proj.format == m.shared_expert.up_proj.format)
    return encode_moe_mlp_fused(enc, m, post_norm, rows);
  const ModelDims& d = model_.dims;
  Workspace& w = *ws_;
  const uint32_t H = uint32_t(d.hidden), E = uint32_t(d.experts), K = uint32_t(d.experts_per_token);
  const uint32_t I = uint32_t(d.moe_intermediate), pairs = rows * K;
  const bool grouped = !matvec;
  // The post norm with the router and the shared expert's gate; everything after reads xn.
  encode_normed_projections(enc, matvec, post_norm, true,
                            {{&m.gate, w.router_logits, E}, {&m.shared_expert_gate, w.shared_gate, 1}}, rows);
  const MoeRouteParams rp{.experts = E, .top_k = K, .logit_stride = E, .norm_top_k = d.norm_top_k ? 1u : 0u};
  enc.dispatch(*k_.moe_route, {w.router_logits, w.route_ids, w.route_weights, Arg::value(rp)}, {rows},
               {MQ_MOE_ROUTE_THREADS});
  encode_mlp(enc, matvec, m.shared_expert, rows, uint32_t(d.shared_intermediate));  // into mix

  // y = W_e x for every (row, expert) pair: gathered matvecs, or one GEMM per expert over x grouped by expert.
  auto experts = [&](const QuantLinear& l, const Arg& x, const Arg& y, uint32_t x_pairs, bool overlap) {
    const MoeMatmulParams p{
        .in_dim = l.in, .out_dim = l.out, .experts = E, .x_pairs = x_pairs, .x_stride = l.in, .y_stride = l.out};
    if (grouped)  // a token picks an expert at most once: no expert has more than `rows` rows
      enc.dispatch(*l.kernels.moe_qmm,
                   {at(l.weight), scales_of(l), biases_of(l), w.expert_offsets, x, y, Arg::value(p)},
                   {ceil_div(rows, MQ_QMM_TILE_ROWS), ceil_div(l.out, MQ_QMM_TILE_OUT), E}, {MQ_QMM_THREADS}, overlap);
    else
      enc.dispatch(*l.kernels.moe_qmv, {at(l.weight), scales_of(l), biases_of(l), w.route_ids, x, y, Arg::value(p)},
                   {ceil_div(l.out, MQ_QMV_ROWS_PER_THREADGROUP), pairs}, {MQ_QMV_THREADS}, overlap);
  };
  if (grouped) {
    const MoeGroupParams gp{.experts = E, .pairs = pairs};
    enc.dispatch(*k_.moe_group, {w.route_ids, w.expert_offsets, w.expert_order, w.expert_slot, Arg::value(gp)}, {1});
    const MoeGatherParams xp{.dim = H, .pairs = pairs, .top_k = K, .src_stride = H, .dst_stride = H};
    enc.dispatch_threads(*k_.moe_gather_rows, {w.xn, w.expert_order, w.expert_x, Arg::value(xp)}, {H / 4, pairs});
  }
  // Grouped rows are one per pair; otherwise pairs read their token's row of xn.
  const Arg x = grouped ? Arg(w.expert_x) : Arg(w.xn);
  experts(m.gate_proj, x, w.expert_gate, grouped ? 1 : K, false);
  experts(m.up_proj, x, w.expert_up, grouped ? 1 : K, true);
  const SiluMulParams sm{.n = I, .rows = pairs, .gate_stride = I, .up_stride = I, .out_stride = I};
  enc.dispatch_threads(*k_.silu_mul, {w.expert_gate, w.expert_up, w.expert_act, Arg::value(sm)},
                       {ceil_div(I, 4), pairs});
  experts(m.down_proj, w.expert_act, w.expert_out, 1, false);
  const MoeCombineParams cp{.dim = H,
                            .rows = rows,
                            .top_k = K,
                            .grouped = grouped ? 1u : 0u,
                            .eo_stride = H,
                            .y_stride = H,
                            .gate_stride = 1};
  enc.dispatch_threads(*k_.moe_combine,
                       {w.expert_out, w.expert_slot, w.route_weights, w.shared_gate, w.mix, Arg::value(cp)},
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
  encode_normed_projections(enc, true, post_norm, true,
                            {{&m.gate, w.router_logits, E}, {&m.shared_expert_gate, w.shared_gate, 1}}, rows, true);
  const QuantLinear &gate = m.gate_proj, &up = m.up_proj, &down = m.down_proj;
  const MoeRouteSiluParams rp{.in_dim = H,
                              .out_dim = I,
                              .experts = E,
                              .top_k = K,
                              .norm_top_k = d.norm_top_k ? 1u : 0u,
                              .logit_stride = E,
                              .x_stride = H,
                              .act_stride = I};
  enc.dispatch(*gate.kernels.moe_qmv_route_silu,
               {at(gate.weight), scales_of(gate), biases_of(gate), at(up.weight), scales_of(up), biases_of(up),
                w.router_logits, w.xn, w.expert_act, w.route_ids, w.route_weights, Arg::value(rp)},
               {ceil_div(I, MQ_MOE_SILU_ROWS_PER_THREADGROUP), rows * K}, {MQ_QMV_THREADS});
  encode_projection(enc, true, m.shared_expert.down_proj, w.act, shared_I, w.mix, H, rows, true);
  const MoeCombineQmvParams cp{
      .in_dim = I, .out_dim = H, .experts = E, .top_k = K, .act_stride = I, .gate_stride = 1, .y_stride = H};
  enc.dispatch(*down.kernels.moe_qmv_combine,
               {at(down.weight), scales_of(down), biases_of(down), w.route_ids, w.route_weights, w.expert_act,
                w.shared_gate, w.mix, Arg::value(cp)},
               {ceil_div(H, MQ_QMV_ROWS_PER_THREADGROUP), rows}, {MQ_QMV_THREADS});
}

}  // namespace mq::engine
