// The multi-token-prediction (MTP) head of Qwen3.5 checkpoints (`mtp_num_hidden_layers: 1`):
// given the trunk's hidden state h[t] and the next token x[t+1], it predicts x[t+2].
//
// The math, with where each point is established (references read, no code taken):
// - h[t] is the trunk's state AFTER its final norm, the tensor lm_head scores (vLLM
//   qwen3_5_mtp.py / qwen3_next_mtp.py feed the target model's post-norm hidden states,
//   SGLang qwen3_5_mtp.py likewise); mlx-lm PR #990 and exllamav3 use the pre-norm state:
//   EngineOptions::mtp_hidden = pre_norm (the residual stream before the final norm).
// - u = fc(concat[rms(embed(x[t+1])) * pre_fc_norm_embedding, rms(h[t]) * pre_fc_norm_hidden]),
//   the embedding half FIRST (vLLM and SGLang concatenate [embedding, hidden]); fc: 2H -> H;
//   embed is the trunk's embed_tokens.
// - one full-attention decoder layer exactly like the trunk's attention layers (gated q,
//   q/k norms, partial RoPE; dense MLP for qwen3_5, sparse MoE for qwen3_5_moe), with its
//   own KV cache holding the whole MTP history (vLLM and SGLang keep one per MTP layer);
//   the pair (h[t], x[t+1]) sits at position t (vLLM passes the target positions through).
// - then mtp.norm, then the trunk's lm_head (the embedding when tied).
// - depth 2-3 (chained drafts): the output after mtp.norm is the next step's h, paired
//   with the drafted id, one position further.
// - every MTP RMSNorm is zero-centred (used as 1 + w: vLLM and SGLang load them as
//   GemmaRMSNorm); the engine multiplies by them as given (shifted by Python, checkpoint.py).
#pragma once
#include "workspace.h"

namespace mq::engine {

// Tensor names as Python hands them over (whatever prefix the folder used: mtp.*).
struct MtpWeights {
  DeviceTensor pre_fc_norm_embedding, pre_fc_norm_hidden;  // [hidden], 1 + w
  QuantLinear fc;                                          // [hidden][2 hidden]: input [embedding | hidden]
  LayerWeights layer;                                      // mtp.layers.0: full attention, its own k/v cache
  DeviceTensor norm;                                       // [hidden], 1 + w
  // rms_norm for each pre_fc norm, rms_norm_residual for mtp.norm (their dtypes' variants).
  const Pipeline *norm_embedding = nullptr, *norm_hidden = nullptr, *norm_residual = nullptr;
  const Pipeline* fill_u32 = nullptr;  // zeros the cache rows of positions fed without the head
};

}  // namespace mq::engine
