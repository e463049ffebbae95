#include "vision.h"

#include <cmath>
#include <cstring>
#include <exception>

#include "errors.h"
#include "workspace.h"

namespace mq::engine {
namespace {

const std::string kPrefix = "vision_tower.";

ThreadgroupNeed exactly(uint32_t threads) { return {.preferred = threads, .minimum = threads}; }
ThreadgroupNeed up_to(uint32_t threads) { return {.preferred = threads, .minimum = MQ_SIMD_WIDTH}; }

uint32_t ceil_div(uint32_t n, uint32_t d) { return (n + d - 1) / d; }

// The weight format a linear's kernels read: its placed dtype (F16 tensors other than 2-D
// matrices are F32 copies), with a bias of the matching width.
std::string linear_format(const std::string& module, const TensorDesc& w, const TensorDesc& b) {
  const std::string format = w.dtype == "BF16" ? "bf16" : w.dtype == "F16" ? "f16" : w.dtype == "F32" ? "f32" : "";
  const std::string bias = format == "bf16" ? "BF16" : "F32";
  if (format.empty() || b.dtype != bias)
    throw EngineError("[vision] " + module + ": weight " + w.dtype + " with bias " + b.dtype +
                      " (the tower takes BF16 weights with BF16 biases, or F16/F32 ones with F16/F32 biases)");
  return format;
}

// The learned position grid (side x side rows) interpolated bilinearly to an h x w patch grid,
// as mlx-vlm's fast_pos_embed_interpolate: linspace(0, side - 1, n), floor/ceil neighbours;
// rows in the merger's order. index/weight: 4 per row, floor-floor, floor-ceil, ceil-floor, ceil-ceil.
void position_grid(int side, int h, int w, std::vector<uint32_t>& index, std::vector<float>& weight) {
  auto coords = [&](int n) {
    std::vector<float> c(size_t(n), 0.0f);
    const float step = n > 1 ? float(side - 1) / float(n - 1) : 0.0f;
    for (int i = 0; i < n; ++i) c[size_t(i)] = float(i) * step;
    return c;
  };
  const std::vector<float> hs = coords(h), ws = coords(w);
  index.clear();
  weight.clear();
  for (int bh = 0; bh < h / 2; ++bh)
    for (int bw = 0; bw < w / 2; ++bw)
      for (int ih = 0; ih < 2; ++ih)
        for (int iw = 0; iw < 2; ++iw) {
          const float y = hs[size_t(bh * 2 + ih)], x = ws[size_t(bw * 2 + iw)];
          const int y0 = int(y), x0 = int(x), y1 = std::min(y0 + 1, side - 1), x1 = std::min(x0 + 1, side - 1);
          const float dy = y - float(y0), dx = x - float(x0);
          for (int id : {y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1}) index.push_back(uint32_t(id));
          for (float wt : {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx}) weight.push_back(wt);
        }
}

// The vision_bias_* suffix of a quantized linear's bias: bf16 as stored, or f32 (F16 widened).
std::string bias_format(const std::string& module, const TensorDesc& b) {
  if (b.dtype != "BF16" && b.dtype != "F32")
    throw EngineError("[vision] " + module + ".bias: " + b.dtype + " (the tower takes BF16, F16 or F32 biases)");
  return b.dtype == "BF16" ? "bf16" : "f32";
}

std::shared_ptr<gpu::Buffer> upload(gpu::Device& device, const void* data, size_t bytes) {
  auto b = device.new_buffer(bytes);
  std::memcpy(b->contents(), data, bytes);
  return b;
}

}  // namespace

VisionTower::VisionTower(std::shared_ptr<gpu::Device> device, VisionDesc desc, const Kernels::Progress& progress)
    : device_(std::move(device)),
      dims_(desc.dims),
      tensors_{{}, std::move(desc.tensors)},
      weights_(*device_, tensors_) {
  const VisionDims& d = dims_;
  if (d.depth < 1 || d.hidden < 1 || d.heads < 1 || d.hidden % d.heads || d.head_dim() % 4 ||
      d.head_dim() > MQ_VISION_MAX_HEAD_DIM || d.merge != 2 || d.patch_dim() < 1)
    throw EngineError("[vision] unsupported tower: hidden " + std::to_string(d.hidden) + ", " +
                      std::to_string(d.heads) + " heads, merge " + std::to_string(d.merge) +
                      " (head dim a multiple of 4 up to " + std::to_string(MQ_VISION_MAX_HEAD_DIM) + ", merge 2)");
  const uint32_t H = uint32_t(d.hidden), M = H * 4;
  patch_embed_ = linear("patch_embed.proj", uint32_t(d.patch_dim()), H);
  pos_embed_ = weights_.tensor(kPrefix + "pos_embed.weight");
  if (pos_embed_.desc->bits != 0) {
    pos_quant_ = weights_.linear(kPrefix + "pos_embed");
    if (pos_quant_.experts || pos_quant_.in != H || pos_quant_.out != uint32_t(d.position_embeddings))
      throw EngineError("[vision] " + kPrefix + "pos_embed.weight is not a quantized [" +
                        std::to_string(d.position_embeddings) + "][" + std::to_string(H) + "] table");
  }
  for (int i = 0; i < d.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    blocks_.push_back({norm(b + "norm1"), norm(b + "norm2"), linear(b + "attn.qkv", H, 3 * H),
                       linear(b + "attn.proj", H, H), linear(b + "mlp.linear_fc1", H, uint32_t(d.intermediate)),
                       linear(b + "mlp.linear_fc2", uint32_t(d.intermediate), H)});
  }
  merger_norm_ = norm("merger.norm");
  merger_fc1_ = linear("merger.linear_fc1", M, M);
  merger_fc2_ = linear("merger.linear_fc2", M, uint32_t(d.out_hidden));

  KernelPlan plan;
  const std::string table = pos_quant_.weight.desc ? "F32" : pos_embed_.desc->dtype;  // gathered as f32
  plan.need(pos_embed_kernel_,
            std::string("vision_pos_embed_") + (table == "BF16"  ? "bf16"
                                                : table == "F16" ? "f16"
                                                                 : "f32"),
            exactly(MQ_SIMD_WIDTH));
  if (pos_quant_.weight.desc) plan.need(pos_gather_, "embed_" + pos_quant_.format, exactly(MQ_EMBED_THREADS));
  plan.need(rope_, "vision_rope", up_to(MQ_VISION_MAX_HEAD_DIM / 2));
  plan.need(attention_, "vision_attention", up_to(256));
  for (Linear* l : {&patch_embed_, &merger_fc1_, &merger_fc2_}) plan_linear(plan, *l);
  plan_norm(plan, merger_norm_);
  for (Block& b : blocks_) {
    plan_norm(plan, b.norm1);
    plan_norm(plan, b.norm2);
    for (Linear* l : {&b.qkv, &b.proj, &b.fc1, &b.fc2}) plan_linear(plan, *l);
  }
  kernels_.create(*device_, plan.needs(), progress);
  plan.resolve(kernels_);
}

VisionTower::Linear VisionTower::linear(const std::string& module, uint32_t in, uint32_t out) const {
  Linear l;
  l.weight = weights_.tensor(kPrefix + module + ".weight");
  l.bias = weights_.tensor(kPrefix + module + ".bias");
  const TensorDesc& w = *l.weight.desc;
  l.in = in;
  l.out = out;
  if (w.bits != 0) {
    l.quant = weights_.linear(kPrefix + module);
    if (l.quant.experts || l.quant.in != in || l.quant.out != out)
      throw EngineError("[vision] " + kPrefix + module + ".weight is not a quantized [" + std::to_string(out) + "][" +
                        std::to_string(in) + "] matrix");
    l.format = l.quant.format;
    bias_format(kPrefix + module, *l.bias.desc);
    return l;
  }
  int64_t elements = 1;
  for (int64_t n : w.shape) elements *= n;
  if (w.bits != 0 || w.shape.empty() || w.shape[0] != int64_t(out) || elements != int64_t(out) * in)
    throw EngineError("[vision] " + kPrefix + module + ".weight is not an unquantized [" + std::to_string(out) + "][" +
                      std::to_string(in) + "] matrix");
  l.format = linear_format(kPrefix + module, w, *l.bias.desc);
  return l;
}

VisionTower::Norm VisionTower::norm(const std::string& module) const {
  Norm n{weights_.tensor(kPrefix + module + ".weight"), weights_.tensor(kPrefix + module + ".bias")};
  if ((n.weight.desc->dtype == "BF16") != (n.bias.desc->dtype == "BF16"))
    throw EngineError("[vision] " + kPrefix + module + ": weight " + n.weight.desc->dtype + " with bias " +
                      n.bias.desc->dtype + " (both BF16, or both F16/F32)");
  return n;
}

void VisionTower::plan_linear(KernelPlan& plan, Linear& l) {
  if (l.quantized()) {
    plan.need(l.qmm, "qmm_" + l.format, exactly(MQ_QMM_THREADS));
    const std::string b = bias_format(kPrefix, *l.bias.desc);
    const ThreadgroupNeed need = up_to(MQ_VISION_BIAS_THREADS);
    plan.need(l.plain, "vision_bias_" + b, need);
    plan.need(l.gelu_tanh, "vision_bias_gelu_tanh_" + b, need);
    plan.need(l.gelu_erf, "vision_bias_gelu_erf_" + b, need);
    plan.need(l.residual, "vision_bias_residual_" + b, need);
    return;
  }
  const ThreadgroupNeed need = exactly(MQ_VISION_LINEAR_THREADS);
  plan.need(l.plain, "vision_linear_" + l.format, need);
  plan.need(l.gelu_tanh, "vision_linear_gelu_tanh_" + l.format, need);
  plan.need(l.gelu_erf, "vision_linear_gelu_erf_" + l.format, need);
  plan.need(l.residual, "vision_linear_residual_" + l.format, need);
}

void VisionTower::plan_norm(KernelPlan& plan, Norm& n) {
  plan.need(n.kernel, n.weight.desc->dtype == "BF16" ? "vision_layer_norm" : "vision_layer_norm_wf32",
            up_to(MQ_VISION_NORM_THREADS));
}

std::vector<float> VisionTower::features(const std::vector<float>& patches, int grid_h, int grid_w) {
  const auto out = features_buffer(patches, grid_h, grid_w);
  std::vector<float> result(out->size() / 4);
  std::memcpy(result.data(), out->contents(), result.size() * 4);
  return result;
}

std::shared_ptr<gpu::Buffer> VisionTower::features_buffer(const std::vector<float>& patches, int grid_h, int grid_w) {
  const VisionDims& d = dims_;
  const uint32_t side = uint32_t(std::lround(std::sqrt(double(d.position_embeddings))));
  if (grid_h < 2 || grid_w < 2 || grid_h % 2 || grid_w % 2)
    throw EngineError("[vision] patch grid " + std::to_string(grid_h) + " x " + std::to_string(grid_w) +
                      ": each side must be even (2 x 2 patches merge into one feature)");
  const uint32_t n = uint32_t(grid_h) * uint32_t(grid_w), pd = uint32_t(d.patch_dim());
  if (patches.size() != size_t(n) * pd)
    throw EngineError("[vision] " + std::to_string(patches.size()) + " patch values for a " + std::to_string(grid_h) +
                      " x " + std::to_string(grid_w) + " grid of " + std::to_string(pd) + "-value patches");
  const uint32_t H = uint32_t(d.hidden), I = uint32_t(d.intermediate), hd = uint32_t(d.head_dim());
  const uint32_t heads = uint32_t(d.heads), out_rows = n / 4, out_dim = uint32_t(d.out_hidden);

  // The processor's [C][T][P][P] rows in the Conv3d weight's [T][P][P][C] order.
  const uint32_t C = uint32_t(d.in_channels), TPP = pd / C;
  std::vector<float> rows(patches.size());
  for (uint32_t r = 0; r < n; ++r)
    for (uint32_t c = 0; c < C; ++c)
      for (uint32_t j = 0; j < TPP; ++j) rows[size_t(r) * pd + j * C + c] = patches[size_t(r) * pd + c * TPP + j];
  std::vector<uint32_t> index, positions;
  std::vector<float> weight, inv_freq;
  position_grid(int(side), grid_h, grid_w, index, weight);
  for (int bh = 0; bh < grid_h / 2; ++bh)
    for (int bw = 0; bw < grid_w / 2; ++bw)
      for (int ih = 0; ih < 2; ++ih)
        for (int iw = 0; iw < 2; ++iw) {
          positions.push_back(uint32_t(bh * 2 + ih));
          positions.push_back(uint32_t(bw * 2 + iw));
        }
  // mlx-vlm's VisionRotaryEmbedding(head_dim / 2): 1 / theta^(2j / (head_dim / 2)), theta 10000.
  for (uint32_t j = 0; j < hd / 4; ++j) inv_freq.push_back(1.0f / std::pow(10000.0f, float(2 * j) / float(hd / 2)));

  gpu::Device& dev = *device_;
  auto in = upload(dev, rows.data(), rows.size() * 4);
  auto idx = upload(dev, index.data(), index.size() * 4), wts = upload(dev, weight.data(), weight.size() * 4);
  auto pos = upload(dev, positions.data(), positions.size() * 4),
       inv = upload(dev, inv_freq.data(), inv_freq.size() * 4);
  // Activations [n][...] f32: the stream x, its normed rows xn, qkv [n][3H], the attention's
  // output [n][H], the MLP's hidden rows [n][I]; the merger's [n/4][4H] and [n/4][out].
  auto x = dev.new_buffer(size_t(n) * H * 4), xn = dev.new_buffer(size_t(n) * H * 4);
  auto qkv = dev.new_buffer(size_t(n) * 3 * H * 4), attn = dev.new_buffer(size_t(n) * H * 4);
  auto mlp = dev.new_buffer(size_t(n) * std::max(I, H) * 4), out = dev.new_buffer(size_t(out_rows) * out_dim * 4);
  // A quantized residual linear's product [n][H] before its bias is added to x.
  bool residual_quantized = false;
  for (const Block& b : blocks_) residual_quantized |= b.proj.quantized() || b.fc2.quantized();
  auto product = residual_quantized ? dev.new_buffer(size_t(n) * H * 4) : x;

  Encoder enc(dev, kernels_, "vision tower");
  // y = epilogue(x W^T + b) over r rows: k is l's plain, gelu_tanh, gelu_erf or residual pipeline.
  auto run = [&](const Pipeline& k, const Linear& l, const Arg& xa, const Arg& ya, uint32_t r) {
    if (!l.quantized()) {
      const VisionLinearParams p{r, l.in, l.out, l.in, l.out};
      enc.dispatch(k, {xa, at(l.weight), at(l.bias), ya, Arg::value(p)},
                   {ceil_div(l.out, MQ_VISION_TILE), ceil_div(r, MQ_VISION_TILE)});
      return;
    }
    // The product goes to y itself unless the bias adds it to y's rows (residual).
    const Arg t = &k == l.residual ? Arg(product) : ya;
    const QuantMatmulParams qp{.in_dim = l.in, .out_dim = l.out, .rows = r, .x_stride = l.in, .y_stride = l.out};
    enc.dispatch(*l.qmm, {at(l.quant.weight), scales_of(l.quant), biases_of(l.quant), xa, t, Arg::value(qp)},
                 {ceil_div(r, MQ_QMM_TILE_ROWS), ceil_div(l.out, MQ_QMM_TILE_OUT)}, {MQ_QMM_THREADS});
    const VisionBiasParams bp{r, l.out, l.out, l.out};
    enc.dispatch_threads(k, {t, at(l.bias), ya, Arg::value(bp)}, {l.out, r});
  };
  auto layer_norm = [&](const Norm& nm) {
    const VisionNormParams p{H, H, H, d.eps};
    enc.dispatch(*nm.kernel,
                 {x, Arg(nm.weight.buffer, nm.weight.offset), Arg(nm.bias.buffer, nm.bias.offset), xn, Arg::value(p)},
                 {n});
  };
  const VisionPosEmbedParams pp{n, H};
  if (pos_quant_.weight.desc) {
    // The 4 neighbours of every patch gathered from the quantized grid: f32 [4n][H], row 4r + c.
    std::vector<uint32_t> rows_of(index.size());
    for (uint32_t i = 0; i < rows_of.size(); ++i) rows_of[i] = i;
    auto gathered = dev.new_buffer(index.size() * H * 4), seq = upload(dev, rows_of.data(), rows_of.size() * 4);
    const QuantEmbedParams ep{.dim = H, .vocab = pos_quant_.out, .first = 0, .rows = uint32_t(index.size())};
    enc.dispatch(*pos_gather_,
                 {at(pos_quant_.weight), scales_of(pos_quant_), biases_of(pos_quant_), idx, gathered, Arg::value(ep)},
                 {ceil_div(H, MQ_EMBED_THREADS * MQ_QUANT_BLOCK), uint32_t(index.size())}, {MQ_EMBED_THREADS});
    enc.dispatch(*pos_embed_kernel_, {gathered, seq, wts, x, Arg::value(pp)}, {ceil_div(H, MQ_SIMD_WIDTH), n},
                 {MQ_SIMD_WIDTH});
  } else {
    enc.dispatch(*pos_embed_kernel_, {at(pos_embed_), idx, wts, x, Arg::value(pp)}, {ceil_div(H, MQ_SIMD_WIDTH), n},
                 {MQ_SIMD_WIDTH});
  }
  run(*patch_embed_.residual, patch_embed_, in, x, n);
  const VisionRopeParams rp{n, heads, hd, 3 * H};
  const VisionAttentionParams ap{n, heads, hd, 3 * H, H, 1.0f / std::sqrt(float(hd))};
  const uint32_t simdgroups = attention_->threads / MQ_SIMD_WIDTH;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (i > 0 && i % kBlocksPerBuffer == 0) enc.split();
    layer_norm(b.norm1);
    run(*b.qkv.plain, b.qkv, xn, qkv, n);
    enc.dispatch(*rope_, {qkv, pos, inv, Arg::value(rp)}, {1, heads, n}, {hd / 2});
    enc.dispatch(*attention_, {qkv, attn, Arg::value(ap)}, {ceil_div(n, simdgroups), heads});
    run(*b.proj.residual, b.proj, attn, x, n);
    layer_norm(b.norm2);
    run(*b.fc1.gelu_tanh, b.fc1, xn, mlp, n);
    run(*b.fc2.residual, b.fc2, mlp, x, n);
  }
  layer_norm(merger_norm_);  // xn read as [n/4][4H]: a 2 x 2 block's rows are consecutive
  run(*merger_fc1_.gelu_erf, merger_fc1_, xn, mlp, out_rows);
  run(*merger_fc2_.plain, merger_fc2_, mlp, out, out_rows);
  // Every buffer is waited for before an error (the first, naming its buffer) is rethrown.
  std::exception_ptr failed;
  for (auto& cb : enc.finish()) {
    try {
      cb->wait();
    } catch (const gpu::GpuError&) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return out;
}

}  // namespace mq::engine
