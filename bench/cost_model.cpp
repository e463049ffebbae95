#include "cost_model.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "../shaders/params.h"

namespace mq::bench {
namespace {

using engine::RecordedDispatch;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The parameter struct: the last setBytes argument of every model kernel.
template <class P>
P params_of(const RecordedDispatch& d) {
  for (auto it = d.args.rbegin(); it != d.args.rend(); ++it)
    if (!it->bytes.empty()) {
      if (it->bytes.size() != sizeof(P))
        throw std::runtime_error("[bench] " + d.kernel + ": unexpected parameter size");
      P p;
      std::memcpy(&p, it->bytes.data(), sizeof(P));
      return p;
    }
  throw std::runtime_error("[bench] " + d.kernel + " has no parameter struct");
}

// The step's segments (params/common.h): the setBytes argument just before the parameters of
// the kernels that index per-sequence memory.
StepSegments segments_of(const RecordedDispatch& d) {
  for (const auto& a : d.args)
    if (a.bytes.size() == sizeof(StepSegments)) {
      StepSegments s;
      std::memcpy(&s, a.bytes.data(), sizeof(s));
      return s;
    }
  throw std::runtime_error("[bench] " + d.kernel + " has no step segments");
}

uint32_t step_rows(const StepSegments& s) {
  uint32_t rows = 0;
  for (uint32_t i = 0; i < s.count; ++i) rows += s.seg[i].rows;
  return rows;
}

// Bytes per weight of a projection format (the kernel-name suffix after "<op>_").
double weight_bytes_per_element(const std::string& format) {
  if (format == "bf16" || format == "f16") return 2;
  if (format == "f32") return 4;
  if (format == "mxfp4") return 0.5 + 1.0 / 32;
  if (format == "nvfp4") return 0.5 + 1.0 / 16;
  if (format == "mxfp8") return 1 + 1.0 / 32;
  int bits = 0, group = 0;
  if (std::sscanf(format.c_str(), "b%d_g%d", &bits, &group) == 2)  // scale and bias per group
    return bits / 8.0 + (contains(format, "_sf32") ? 8.0 : 4.0) / group;
  return 0;
}

std::string suffix_after(const std::string& kernel, const char* op) { return kernel.substr(std::strlen(op) + 1); }

// A decode/verify matvec's name "<op>_r<R>_<format>" (shaders/params/quant.h): its format, and
// " r<R>" for the sizes column (the variant the engine picked for the shape).
struct MatvecName {
  std::string format, variant;
};
MatvecName matvec_name(const std::string& kernel, const char* op) {
  const std::string rest = suffix_after(kernel, op);  // "r<R>_<format>"
  const size_t cut = rest.find('_');
  if (rest.empty() || rest[0] != 'r' || cut == std::string::npos)
    throw std::runtime_error("[bench] " + kernel + ": not <op>_r<R>_<format>");
  return {rest.substr(cut + 1), " " + rest.substr(0, cut)};
}

std::string by(uint32_t out, uint32_t in) { return std::to_string(out) + "x" + std::to_string(in); }

double vector_bytes(const std::string& kernel) { return contains(kernel, "_wf32") ? 4 : 2; }

// K/V cache bytes per element.
double cache_bytes(const std::string& kernel) { return contains(kernel, "q8") ? 1 + 2.0 / MQ_ATTN_Q8_BLOCK : 2; }

}  // namespace

DispatchCost dispatch_cost(const RecordedDispatch& d) {
  const std::string& k = d.kernel;
  constexpr double F = 4;  // f32 activations
  if (starts_with(k, "qmv_norm")) {  // before qmv_: the norm-fused group / gate-up kernels
    const auto p = params_of<QmvNormParams>(d);
    const bool silu = starts_with(k, "qmv_norm_silu");
    const char* op = silu ? (starts_with(k, "qmv_norm_silu_rows") ? "qmv_norm_silu_rows" : "qmv_norm_silu")
                          : (starts_with(k, "qmv_norm_rows") ? "qmv_norm_rows" : "qmv_norm");
    double out = 0;
    for (uint32_t m = 0; m < p.members; ++m) out += p.out_dim[m];
    const double weights_out = silu ? 2 * out : out;  // gate and up rows
    const MatvecName name = matvec_name(k, op);
    const double w = weights_out * p.in_dim * weight_bytes_per_element(name.format);
    const double mix = (p.flags & MQ_QMV_ADD_MIX) ? 1 : 0;
    // x (+ mix) in, h and xn out (one threadgroup), y out; the norm weight once
    const double act = p.rows * (p.in_dim * F * (1 + mix) + p.in_dim * F * (1 + mix) + out * F);
    return {by(uint32_t(weights_out), p.in_dim) + (p.rows > 1 ? " x" + std::to_string(p.rows) : "") +
                (silu ? " +silu" : "") + " +norm" + name.variant,
            w + act + p.in_dim * F, 2.0 * p.rows * weights_out * p.in_dim};
  }
  if (starts_with(k, "qmv_head_norm")) {  // before qmv_: DeltaNet's out_proj with the gated norm's factor
    const auto p = params_of<QmvHeadNormParams>(d);
    const MatvecName name = matvec_name(k,
                                        starts_with(k, "qmv_head_norm_rows") ? "qmv_head_norm_rows" : "qmv_head_norm");
    const double w = double(p.out_dim) * p.in_dim * weight_bytes_per_element(name.format);
    const double partials = double(p.in_dim) / MQ_DELTA_HEAD_DIM * MQ_DELTA_HEAD_PARTIALS;
    // g and the heads' partial sums in, y out
    return {by(p.out_dim, p.in_dim) + (p.rows > 1 ? " x" + std::to_string(p.rows) : "") + " +head norm" + name.variant,
            w + p.rows * (p.in_dim + partials + p.out_dim) * F, 2.0 * p.rows * p.out_dim * p.in_dim};
  }
  if (starts_with(k, "qmv_rows_") || starts_with(k, "qmv_") || starts_with(k, "qmm_")) {
    const auto p = params_of<QuantMatmulParams>(d);
    const char* op = starts_with(k, "qmv_rows_") ? "qmv_rows" : starts_with(k, "qmv_") ? "qmv" : "qmm";
    const double rows = std::strcmp(op, "qmv") == 0 ? 1 : p.rows;
    const MatvecName name = std::strcmp(op, "qmm") == 0 ? MatvecName{suffix_after(k, op), ""} : matvec_name(k, op);
    const double w = double(p.out_dim) * p.in_dim * weight_bytes_per_element(name.format);
    return {by(p.out_dim, p.in_dim) + (rows > 1 ? " x" + std::to_string(int(rows)) : "") + name.variant,
            w + rows * (p.in_dim + p.out_dim) * F, 2.0 * rows * p.out_dim * p.in_dim};
  }
  if (starts_with(k, "moe_qmv_route_silu_")) {  // before moe_qmv_: the fused decode/verify kernels
    const auto p = params_of<MoeRouteSiluParams>(d);
    const double pairs = d.grid.y;  // one (row, chosen expert) each
    const double w = 2.0 * p.out_dim * p.in_dim * weight_bytes_per_element(suffix_after(k, "moe_qmv_route_silu"));
    // per pair its expert's gate and up, its row's x and router logits in, the activation out
    return {by(2 * p.out_dim, p.in_dim) + " x" + std::to_string(int(pairs)) + " experts +route +silu",
            pairs * (w + (p.in_dim + p.experts + p.out_dim) * F), 4.0 * pairs * p.out_dim * p.in_dim};
  }
  if (starts_with(k, "moe_qmv_combine_")) {
    const auto p = params_of<MoeCombineQmvParams>(d);
    const double rows = d.grid.y, pairs = rows * p.top_k;
    const double w = double(p.out_dim) * p.in_dim * weight_bytes_per_element(suffix_after(k, "moe_qmv_combine"));
    // per pair its expert's down, activation, id and weight in; per row the shared expert's
    // output and gate in, the MLP output out
    return {by(p.out_dim, p.in_dim) + " x" + std::to_string(int(pairs)) + " experts +combine",
            pairs * (w + p.in_dim * F + 8) + rows * (2.0 * p.out_dim * F + 4),
            2.0 * pairs * p.out_dim * p.in_dim + 2.0 * rows * (p.top_k + 1) * p.out_dim};
  }
  if (starts_with(k, "moe_qmv_")) {
    const auto p = params_of<MoeMatmulParams>(d);
    const double pairs = d.grid.y;  // one matvec per (row, chosen expert)
    const double w = double(p.out_dim) * p.in_dim * weight_bytes_per_element(suffix_after(k, "moe_qmv"));
    return {by(p.out_dim, p.in_dim) + " x" + std::to_string(int(pairs)) + " experts",
            pairs * (w + (p.in_dim + p.out_dim) * F), 2.0 * pairs * p.out_dim * p.in_dim};
  }
  if (starts_with(k, "embed_")) {
    const auto p = params_of<QuantEmbedParams>(d);
    return {std::to_string(p.dim) + " x" + std::to_string(p.rows),
            double(p.rows) * p.dim * (weight_bytes_per_element(suffix_after(k, "embed")) + F), 0};
  }
  if (starts_with(k, "rms_norm")) {
    const auto p = params_of<RmsNormParams>(d);
    const double rows = d.grid.x, residual = starts_with(k, "rms_norm_residual") ? 2 : 0;
    return {std::to_string(p.dim) + (residual ? " +residual" : ""),
            rows * p.dim * F * (2 + residual) + p.dim * vector_bytes(k), rows * p.dim * 4.0};
  }
  if (k == "silu_mul") {
    const auto p = params_of<SiluMulParams>(d);
    return {std::to_string(p.n), 3.0 * p.rows * p.n * F, 5.0 * p.rows * p.n};
  }
  if (starts_with(k, "delta_conv_scan")) {
    const auto p = params_of<DeltaScanParams>(d);
    const StepSegments segs = segments_of(d);
    const double D = MQ_DELTA_HEAD_DIM, state = p.n_v * D * D * F, rows = step_rows(segs);
    const double C = (2.0 * p.n_k + p.n_v) * D;
    // per sequence, the f32 state read and written once and its history; per row raw inputs
    // (and their ring copy with store_history), a/b and z in, g and the y^2 partials out; the
    // taps and norm weight (the q/k conv repeats per SIMD-group, from cache: counted once)
    const double partials = double(p.n_v) * MQ_DELTA_HEAD_PARTIALS;
    const double bytes = segs.count * (2 * state + (p.ksize - 1) * C * F) +
                         rows * (C * F * (p.store_history ? 2 : 1) + 2 * p.n_v * F + 2 * p.n_v * D * F + partials * F) +
                         C * p.ksize * vector_bytes(k) + D * (p.norm_f32 ? 4 : 2);
    return {std::to_string(p.n_v) + " heads", bytes,
            rows * (8.0 * p.n_v * D * D + C * 2.0 * p.ksize + 6.0 * p.n_v * D)};
  }
  if (starts_with(k, "delta_norm_history")) {
    const auto p = params_of<DeltaNormParams>(d);
    const StepSegments segs = segments_of(d);
    const double D = MQ_DELTA_HEAD_DIM, C = (2.0 * p.n_k + p.n_v) * D, rows = step_rows(segs);
    double stored = 0;  // per sequence, its last rows into its history ring
    for (uint32_t i = 0; i < segs.count; ++i) stored += std::min(segs.seg[i].rows, p.hist_slots);
    // g and the heads' y^2 partials in, the normalised g out; raw inputs copied into the history ring
    return {std::to_string(p.n_v) + " heads",
            rows * (2 * p.n_v * D + p.n_v * MQ_DELTA_HEAD_PARTIALS) * F + 2 * stored * C * F, rows * p.n_v * D * 1.0};
  }
  if (starts_with(k, "attn_qk_norm_rope_append")) {
    const auto p = params_of<AttnPrepParams>(d);
    const double HD = MQ_ATTN_HEAD_DIM;
    const double bytes = p.rows * (2 * p.nq * HD * F + 2 * p.nkv * HD * F + 2 * p.nkv * HD * cache_bytes(k));
    return {std::to_string(p.nq) + "/" + std::to_string(p.nkv) + " heads", bytes, p.rows * (p.nq + p.nkv) * HD * 8.0};
  }
  if (starts_with(k, "attn_decode_combine")) {
    const auto p = params_of<AttnDecodeParams>(d);
    const double HD = MQ_ATTN_HEAD_DIM, rows = step_rows(segments_of(d));
    return {std::to_string(p.n_splits) + " splits", rows * p.nq * (p.n_splits * (HD * F + 8) + HD * F * 2 + HD * F),
            rows * p.nq * p.n_splits * HD * 2.0};
  }
  if (starts_with(k, "attn_decode")) {
    const auto p = params_of<AttnDecodeParams>(d);
    const StepSegments segs = segments_of(d);
    const double HD = MQ_ATTN_HEAD_DIM, rows = step_rows(segs);
    double context = 0, row_context = 0;  // summed over the sequences: positions, and rows x positions
    for (uint32_t i = 0; i < segs.count; ++i) {
      context += double(segs.seg[i].position) + segs.seg[i].rows;
      row_context += segs.seg[i].rows * (double(segs.seg[i].position) + segs.seg[i].rows);
    }
    // each sequence's K and V once (the step's rows raw in, appended out), q (query and gate) in, the output out
    const double bytes = 2 * context * p.nkv * HD * cache_bytes(k) + rows * (p.nq * HD * F * 3 + 2 * p.nkv * HD * F);
    return {"ctx " + std::to_string(int(context)), bytes, 4.0 * p.nq * row_context * HD};
  }
  if (starts_with(k, "attn_prefill")) {
    const auto p = params_of<AttnParams>(d);
    const double HD = MQ_ATTN_HEAD_DIM, context = double(p.pos_base) + p.rows;
    // K and V of the context once, q (query and gate) in, the output out
    const double bytes = 2 * context * p.nkv * HD * cache_bytes(k) + p.rows * p.nq * HD * F * 3;
    const double attended = p.pos_base + (p.rows + 1) / 2.0;  // causal mean
    return {"ctx " + std::to_string(int(context)), bytes, 4.0 * p.rows * p.nq * attended * HD};
  }
  if (starts_with(k, "argmax_partial")) {
    const auto p = params_of<ArgmaxParams>(d);
    return {std::to_string(p.n), double(p.n) * F * d.grid.y + 8.0 * p.n_partials, double(p.n) * d.grid.y};
  }
  if (starts_with(k, "argmax_final")) {
    const auto p = params_of<ArgmaxParams>(d);
    return {std::to_string(p.n_partials) + " partials", 8.0 * p.n_partials * d.grid.x + 4, double(p.n_partials)};
  }
  if (k == "moe_route") {
    const auto p = params_of<MoeRouteParams>(d);
    const double rows = d.grid.x;
    return {std::to_string(p.experts) + " top " + std::to_string(p.top_k), rows * (p.experts * F + p.top_k * 8),
            rows * p.experts * 4.0};
  }
  if (k == "moe_combine") {
    const auto p = params_of<MoeCombineParams>(d);
    return {std::to_string(p.dim) + " top " + std::to_string(p.top_k),
            p.rows * (p.top_k * (p.dim * F + 4) + 2.0 * p.dim * F + 4), 2.0 * p.rows * (p.top_k + 1) * p.dim};
  }
  return {};
}

}  // namespace mq::bench
