#include "synthetic_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace mq::bench {
namespace {

constexpr int kBits = 4, kGroup = 64;

class Layout {
 public:
  Layout(engine::ModelDesc& desc, std::string path) : desc_(desc), path_(std::move(path)) {}

  void vector(const std::string& name, int64_t n, const std::string& dtype = "BF16") {
    add(name, dtype, {n}, uint64_t(n) * (dtype == "F32" ? 4 : 2), 0, 0);
  }
  void conv(const std::string& name, int64_t channels, int64_t kernel) {
    add(name, "BF16", {channels, kernel, 1}, uint64_t(channels * kernel) * 2, 0, 0);
  }
  // y = W x with W [out][in] (a stack of `experts` when > 0), MLX affine.
  void linear(const std::string& module, int64_t out, int64_t in, int64_t experts = 0, int bits = kBits) {
    std::vector<int64_t> lead;
    if (experts > 0) lead.push_back(experts);
    const int64_t stack = experts > 0 ? experts : 1;
    auto shape = [&](int64_t last) {
      std::vector<int64_t> s = lead;
      s.push_back(out);
      s.push_back(last);
      return s;
    };
    add(module + ".weight", "U32", shape(in * bits / 32), uint64_t(stack * out * in * bits / 8), bits, kGroup);
    add(module + ".scales", "BF16", shape(in / kGroup), uint64_t(stack * out * (in / kGroup) * 2), 0, 0);
    add(module + ".biases", "BF16", shape(in / kGroup), uint64_t(stack * out * (in / kGroup) * 2), 0, 0);
  }
  uint64_t size() const { return end_; }

 private:
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, uint64_t nbytes, int bits,
           int group) {
    engine::TensorDesc t;
    t.file = path_;
    t.offset = end_;
    t.nbytes = nbytes;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.bits = bits;
    t.group = group;
    t.mode = bits ? "affine" : "";
    desc_.tensors[name] = std::move(t);
    end_ += (nbytes + 63) / 64 * 64;  // the kernels' vector loads want 16-byte aligned tensors
  }

  engine::ModelDesc& desc_;
  std::string path_;
  uint64_t end_ = 0;
};

}  // namespace

engine::ModelDesc synthetic_model(const engine::ModelDims& d, const std::string& path) {
  engine::ModelDesc desc;
  desc.dims = d;
  Layout f(desc, path);
  const std::string m = "language_model.model.";
  const int64_t H = d.hidden, D = d.lin_k_dim, HD = d.head_dim;
  f.linear(m + "embed_tokens", d.vocab, H);
  if (!d.tied) f.linear("language_model.lm_head", d.vocab, H);
  f.vector(m + "norm.weight", H);
  for (int i = 0; i < d.layers; ++i) {
    const std::string p = m + "layers." + std::to_string(i) + ".";
    f.vector(p + "input_layernorm.weight", H);
    f.vector(p + "post_attention_layernorm.weight", H);
    if (d.full_attention[size_t(i)]) {
      f.linear(p + "self_attn.q_proj", int64_t(d.heads) * 2 * HD, H);
      f.linear(p + "self_attn.k_proj", int64_t(d.kv_heads) * HD, H);
      f.linear(p + "self_attn.v_proj", int64_t(d.kv_heads) * HD, H);
      f.linear(p + "self_attn.o_proj", H, int64_t(d.heads) * HD);
      f.vector(p + "self_attn.q_norm.weight", HD);
      f.vector(p + "self_attn.k_norm.weight", HD);
    } else {
      const int64_t nk = d.lin_k_heads, nv = d.lin_v_heads, C = 2 * nk * D + nv * D;
      f.linear(p + "linear_attn.in_proj_qkv", C, H);
      f.linear(p + "linear_attn.in_proj_z", nv * D, H);
      f.linear(p + "linear_attn.in_proj_b", nv, H);
      f.linear(p + "linear_attn.in_proj_a", nv, H);
      f.linear(p + "linear_attn.out_proj", H, nv * D);
      f.conv(p + "linear_attn.conv1d.weight", C, d.conv_kernel);
      f.vector(p + "linear_attn.dt_bias", nv);
      f.vector(p + "linear_attn.A_log", nv, "F32");
      f.vector(p + "linear_attn.norm.weight", D);
    }
    auto mlp = [&](const std::string& q, int64_t I) {
      f.linear(q + "gate_proj", I, H);
      f.linear(q + "up_proj", I, H);
      f.linear(q + "down_proj", H, I);
    };
    if (d.experts > 0) {
      f.linear(p + "mlp.gate", d.experts, H, 0, 8);
      f.linear(p + "mlp.switch_mlp.gate_proj", d.moe_intermediate, H, d.experts);
      f.linear(p + "mlp.switch_mlp.up_proj", d.moe_intermediate, H, d.experts);
      f.linear(p + "mlp.switch_mlp.down_proj", H, d.moe_intermediate, d.experts);
      mlp(p + "mlp.shared_expert.", d.shared_intermediate);
      f.linear(p + "mlp.shared_expert_gate", 1, H, 0, 8);
    } else {
      mlp(p + "mlp.", d.intermediate);
    }
  }
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) throw std::runtime_error("[bench] cannot create " + path + ": " + std::strerror(errno));
  const int failed = ftruncate(fd, off_t(f.size()));
  const int error = errno;
  close(fd);
  if (failed) throw std::runtime_error("[bench] cannot size " + path + ": " + std::strerror(error));
  return desc;
}

}  // namespace mq::bench
