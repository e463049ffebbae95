// A DFlash block-diffusion drafter (issue 28; z-lab's drafters as dflash-mlx 0.1.8 and mlx-vlm
// 0.7.10 run them): a few Qwen3 decoder layers conditioned on the target's hidden states.
//
// The math (the references' facts, no code taken):
// - context row t (one per fed token): c[t] = rms(fc(concat_i h_i[t])) * hidden_norm, h_i[t] the
//   target's residual stream after decoder layer target_layer_ids[i] (HF hidden_states[id + 1],
//   before the final norm); each draft layer keeps K[t] = rope_t(rms(k_proj(c[t])) * k_norm) and
//   V[t] = v_proj(c[t]) (no input norm on the context).
// - a block of L rows at positions p .. p + L - 1: ids [ids[p] (the token chosen last), mask_token_id
//   x (L - 1)], embedded with the target's embed_tokens. Per draft layer (pre-norm, RMSNorms
//   multiply by w as stored): xn = rms(x) * input_norm; q, k, v = projections of xn; q and k get
//   their head RMSNorm (q_norm, k_norm) and split-half RoPE over the whole head_dim (theta
//   rope_theta); attention of the block's queries over keys [K[0 .. p - 1], block k] with no mask
//   (non-causal within the block), scale 1/sqrt(head_dim), GQA; x += o_proj(attn);
//   x += down(silu(gate(xn')) * up(xn')), xn' = rms(x) * post_norm.
// - drafts: argmax(lm_head(rms(x) * norm)) of block rows 1 .. L - 1 (the target's lm_head).
#pragma once
#include "workspace.h"

namespace mq::engine {

struct DflashLayer {
  DeviceTensor input_norm, post_norm, q_norm, k_norm;  // bf16 or f32, multiplied as stored
  QuantLinear q_proj, k_proj, v_proj, o_proj;
  MlpWeights mlp;
  // f32 [slots][max_context][kv_heads * head_dim]: K (normed, rotated) and V of the context rows at
  // their positions; a block's own rows are written past them and overwritten as tokens are fed.
  SlotBuffer k_cache, v_cache;
  const Pipeline *input_norm_first = nullptr, *input_norm_residual = nullptr, *post_norm_residual = nullptr;
  const Pipeline* prep = nullptr;  // dflash_qk_norm_rope for the q/k norm dtype
};

struct DflashWeights {
  DrafterDims dims;
  QuantLinear fc;                      // [hidden][n * hidden]
  DeviceTensor hidden_norm, norm;      // [hidden]
  std::vector<DflashLayer> layers;
  const Pipeline *capture = nullptr, *attention = nullptr, *fill_u32 = nullptr;
  const Pipeline *hidden_norm_kernel = nullptr, *final_norm_kernel = nullptr;
  // Scratch, [max_rows] rows each (Workspace::max_rows):
  std::shared_ptr<gpu::Buffer> hidden;  // [rows][n * hidden]: the pass's target states, column block i = layer ids[i]
  std::shared_ptr<gpu::Buffer> ctx_raw, ctx;  // [rows][hidden]: fc out, then after hidden_norm
  std::shared_ptr<gpu::Buffer> k, v;  // [rows][kv_heads * head_dim]
  std::shared_ptr<gpu::Buffer> x, xn, mix;  // [rows][hidden]: the block's residual stream, normed, layer output
  std::shared_ptr<gpu::Buffer> q, attn;  // [rows][heads * head_dim]
  std::shared_ptr<gpu::Buffer> gate, up, act;  // [rows][intermediate]
};

// Bytes of the drafter's context caches (all layers, K and V, every slot) and of its scratch.
uint64_t dflash_cache_bytes(const DrafterDims& d, const EngineOptions& o);
uint64_t dflash_workspace_bytes(const DrafterDims& d, const EngineOptions& o);

}  // namespace mq::engine
