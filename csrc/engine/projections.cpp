// Projections (y = W x, matvec or GEMM by the pass) and the RMS norms before them, fused into
// the matvec where a step's rows allow (shaders/qmv_norm.metal).
#include <algorithm>
#include <utility>

#include "workspace.h"

namespace mq::engine {
namespace {

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// The norm-fused kernels' parameters, members aside: h = x (+ mix), written to x_next (then the
// residual stream: Engine::encode_normed_projections swaps the two) and xn as encode_norm leaves them.
QmvNormParams qmv_norm_params(const ModelDims& dims, const DeviceTensor& norm, bool add_mix, uint32_t rows) {
  return {.in_dim = uint32_t(dims.hidden),
          .rows = rows,
          .x_stride = uint32_t(dims.hidden),
          .flags = uint32_t(MQ_QMV_WRITE_XN | (add_mix ? MQ_QMV_ADD_MIX | MQ_QMV_WRITE_H : 0) |
                            (norm.desc->dtype == "F32" ? MQ_QMV_NORM_F32 : 0)),
          .eps = dims.eps,
          .members = 0,
          .out_dim = {},
          .y_stride = {},
          .tg_end = {}};
}

}  // namespace

void Engine::encode_projection(Encoder& enc, bool matvec, const QuantLinear& l, const Arg& x, uint32_t x_stride,
                               const Arg& y, uint32_t y_stride, uint32_t rows, bool overlap) {
  const QuantMatmulParams p{.in_dim = l.in, .out_dim = l.out, .rows = rows, .x_stride = x_stride, .y_stride = y_stride};
  if (matvec) {
    // One row streams the weights at full width; verify rows share one stream.
    const QmvVariant& v = l.kernels.qmv;
    enc.dispatch(v.pipeline(rows), {at(l.weight), scales_of(l), biases_of(l), x, y, Arg::value(p)},
                 {v.threadgroups(l.out, rows)}, {MQ_QMV_THREADS}, overlap);
  } else {
    enc.dispatch(*l.kernels.qmm, {at(l.weight), scales_of(l), biases_of(l), x, y, Arg::value(p)},
                 {ceil_div(rows, MQ_QMM_TILE_ROWS), ceil_div(l.out, MQ_QMM_TILE_OUT)}, {MQ_QMM_THREADS}, overlap);
  }
}

void Engine::encode_norm(Encoder& enc, const Norm& norm, uint32_t rows, bool add_residual,
                         const std::shared_ptr<gpu::Buffer>& residual) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  const RmsNormParams p{.dim = H, .x_stride = H, .r_stride = H, .y_stride = H, .eps = model_.dims.eps};
  if (add_residual) enc.dispatch(norm.kernel, {ws_->x, residual, at(norm.weight), ws_->xn, Arg::value(p)}, {rows});
  else enc.dispatch(norm.kernel, {ws_->x, at(norm.weight), ws_->xn, Arg::value(p)}, {rows});
}

// y_m = W_m (rms(x (+ mix)) * norm) for every member, x (+ mix) staying the residual stream
// and xn the normed rows. Matvec steps fold the norm into the projections: one dispatch over
// the members' rows when they share a format (else one each, overlapped); prefill steps
// dispatch the norm, then the projections. `overlap` (matvec steps only): the first dispatch
// too runs beside the previous one.
void Engine::encode_normed_projections(Encoder& enc, bool matvec, const Norm& norm, bool add_mix,
                                       std::initializer_list<NormedOutput> members, uint32_t rows, bool overlap) {
  const uint32_t H = uint32_t(model_.dims.hidden);
  Workspace& w = *ws_;
  if (!matvec) {
    encode_norm(enc, norm, rows, add_mix, w.mix);
    bool first = true;
    for (const NormedOutput& m : members) {
      encode_projection(enc, false, *m.l, w.xn, H, m.y, m.y_stride, rows, !first);
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
        groups += v.threadgroups(o.l->out, rows);
        p.out_dim[m] = o.l->out;
        p.y_stride[m] = o.y_stride;
        p.tg_end[m] = groups;
      }
    }
    enc.dispatch(v.pipeline(rows),
                 {wt[0], wt[1], wt[2], wt[3],           sc[0],    sc[1], sc[2], sc[3], bi[0], bi[1], bi[2],
                  bi[3], w.x,   w.mix, at(norm.weight), w.x_next, w.xn,  y[0],  y[1],  y[2],  y[3],  Arg::value(p)},
                 {groups}, {MQ_QMV_THREADS}, overlap || begin != members.begin());
    begin = stop;
  }
  // From here on the residual stream is h (encoding order is execution order).
  if (add_mix) std::swap(w.x, w.x_next);
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
               {v.threadgroups(2 * I, rows)}, {MQ_QMV_THREADS});  // gate and up rows
}

}  // namespace mq::engine
