#include "shapes.h"

namespace mq::bench {
namespace {

// Qwen3.5 constants shared by every size: head_dim 256 with a quarter rotary, linear heads of
// 128, conv kernel 4, every fourth layer full attention, eps 1e-6, theta 1e7.
engine::ModelDims qwen35(int hidden, int layers, int intermediate, int vocab, int heads, int kv_heads, int lin_k_heads,
                         int lin_v_heads, bool tied) {
  engine::ModelDims d;
  d.hidden = hidden;
  d.layers = layers;
  d.intermediate = intermediate;
  d.vocab = vocab;
  d.heads = heads;
  d.kv_heads = kv_heads;
  d.head_dim = 256;
  d.rotary_dim = 64;
  d.lin_k_heads = lin_k_heads;
  d.lin_v_heads = lin_v_heads;
  d.lin_k_dim = d.lin_v_dim = 128;
  d.conv_kernel = 4;
  d.eps = 1e-6f;
  d.rope_theta = 1e7f;
  d.tied = tied;
  for (int i = 0; i < layers; ++i) d.full_attention.push_back((i + 1) % 4 == 0);
  return d;
}

}  // namespace

std::vector<BenchShape> bench_shapes() {
  // Sizes from the models' config.json on Hugging Face (Qwen/Qwen3.5-0.8B, -9B, -27B, -35B-A3B:
  // hidden_size, num_hidden_layers, intermediate_size, vocab_size, attention / key-value heads,
  // linear key / value heads, experts), as the Megatron launch scripts of THUDM/slime restate
  // them for 0.8B, 27B and 35B-A3B (scripts/models/qwen3.5-*.sh).
  std::vector<BenchShape> shapes = {
      {"0.8B", "Qwen3.5-0.8B (tied embeddings)", qwen35(1024, 24, 3584, 248320, 8, 2, 16, 16, true)},
      {"9B", "Qwen3.5-9B", qwen35(4096, 32, 12288, 248320, 16, 4, 16, 32, false)},
      {"27B", "Qwen3.5-27B", qwen35(5120, 64, 17408, 248320, 24, 4, 16, 48, false)},
      {"35B-A3B", "Qwen3.5-35B-A3B (MoE: 256 experts of 512, top 8, shared expert 512)",
       qwen35(2048, 40, 0, 248320, 16, 2, 16, 32, false)},
      {"tiny", "the test checkpoints' size (metalqwen demo): not a real model, for tests",
       qwen35(512, 4, 1024, 1024, 2, 1, 2, 4, true)},
  };
  engine::ModelDims& moe = shapes[3].dims;
  moe.experts = 256;
  moe.experts_per_token = 8;
  moe.moe_intermediate = 512;
  moe.shared_intermediate = 512;
  moe.norm_top_k = true;
  return shapes;
}

}  // namespace mq::bench
