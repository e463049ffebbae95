// The tensors of a decoder layer, one table per part (the layer's norms, each mixer, the dense
// MLP, the MoE block): each tensor's name under the part's prefix, its member and how a step
// reads it. Loading (load_layer), the bytes a decode step streams (decode_weight_bytes) and the
// kernel plan (Engine::plan_kernels) all read these tables.
#pragma once
#include <string>
#include <vector>

#include "workspace.h"

namespace mq::engine {

// How a step reads a layer tensor.
enum class TensorRole {
  vector,      // a norm, conv or gate vector, read whole
  normed,      // a projection of the part's normed input: with the part's other normed ones, one norm-fused group
  projection,  // a projection of an activation (a mixer's output, the MLP's product)
  experts,     // a stack of expert matrices [experts][out][in]: a decode step reads experts_per_token of them
};

// One tensor of part W: a projection (`linear`: name.weight, .scales, .biases) or a vector (`vector`).
template <class W>
struct LayerTensor {
  const char* name;
  TensorRole role;
  QuantLinear W::* linear = nullptr;
  DeviceTensor W::* vector = nullptr;
};

template <class W>
constexpr LayerTensor<W> linear_tensor(const char* name, TensorRole role, QuantLinear W::* member) {
  return {.name = name, .role = role, .linear = member};
}
template <class W>
constexpr LayerTensor<W> vector_tensor(const char* name, DeviceTensor W::* member) {
  return {.name = name, .role = TensorRole::vector, .vector = member};
}

// Under the layer's prefix (e.g. "language_model.model.layers.3.").
inline constexpr LayerTensor<LayerWeights> kLayerNorms[] = {
    vector_tensor("input_layernorm.weight", &LayerWeights::input_norm),
    vector_tensor("post_attention_layernorm.weight", &LayerWeights::post_norm),
};
// Under "self_attn.".
inline constexpr LayerTensor<AttentionWeights> kAttentionTensors[] = {
    linear_tensor("q_proj", TensorRole::normed, &AttentionWeights::q_proj),
    linear_tensor("k_proj", TensorRole::normed, &AttentionWeights::k_proj),
    linear_tensor("v_proj", TensorRole::normed, &AttentionWeights::v_proj),
    linear_tensor("o_proj", TensorRole::projection, &AttentionWeights::o_proj),
    vector_tensor("q_norm.weight", &AttentionWeights::q_norm),
    vector_tensor("k_norm.weight", &AttentionWeights::k_norm),
};
// Under "linear_attn.".
inline constexpr LayerTensor<DeltaNetWeights> kDeltaNetTensors[] = {
    linear_tensor("in_proj_qkv", TensorRole::normed, &DeltaNetWeights::in_proj_qkv),
    linear_tensor("in_proj_z", TensorRole::normed, &DeltaNetWeights::in_proj_z),
    linear_tensor("in_proj_b", TensorRole::normed, &DeltaNetWeights::in_proj_b),
    linear_tensor("in_proj_a", TensorRole::normed, &DeltaNetWeights::in_proj_a),
    linear_tensor("out_proj", TensorRole::projection, &DeltaNetWeights::out_proj),
    vector_tensor("conv1d.weight", &DeltaNetWeights::conv1d),
    vector_tensor("dt_bias", &DeltaNetWeights::dt_bias),
    vector_tensor("A_log", &DeltaNetWeights::a_log),
    vector_tensor("norm.weight", &DeltaNetWeights::norm),
};
// Under "mlp." (dense models), or "mlp.shared_expert." (the MoE block's shared expert).
inline constexpr LayerTensor<MlpWeights> kMlpTensors[] = {
    linear_tensor("gate_proj", TensorRole::normed, &MlpWeights::gate_proj),
    linear_tensor("up_proj", TensorRole::normed, &MlpWeights::up_proj),
    linear_tensor("down_proj", TensorRole::projection, &MlpWeights::down_proj),
};
// Under "mlp." (MoE models), besides the shared expert.
inline constexpr LayerTensor<MoeWeights> kMoeTensors[] = {
    linear_tensor("gate", TensorRole::normed, &MoeWeights::gate),
    linear_tensor("shared_expert_gate", TensorRole::normed, &MoeWeights::shared_expert_gate),
    linear_tensor("switch_mlp.gate_proj", TensorRole::experts, &MoeWeights::gate_proj),
    linear_tensor("switch_mlp.up_proj", TensorRole::experts, &MoeWeights::up_proj),
    linear_tensor("switch_mlp.down_proj", TensorRole::experts, &MoeWeights::down_proj),
};

// The projections of `part` in `role`, in table order.
template <class W, size_t N>
std::vector<QuantLinear*> projections(W& part, const LayerTensor<W> (&table)[N], TensorRole role) {
  std::vector<QuantLinear*> out;
  for (const LayerTensor<W>& t : table)
    if (t.linear && t.role == role) out.push_back(&(part.*t.linear));
  return out;
}

// One decoder layer's weights under `prefix` (e.g. "language_model.model.layers.3."), caches unset.
LayerWeights load_layer(const Weights& weights, const ModelDims& dims, const std::string& prefix, bool full_attention);
// Layers [range.first, range.end).
std::vector<LayerWeights> load_layers(const Weights& weights, const ModelDims& dims, LayerRange range);
// Bytes of weights one decode step streams (every projection once, the lm_head, norms): the
// embedding row when `range` starts at layer 0, the head when it ends at the last.
uint64_t decode_weight_bytes(const Weights& weights, const std::vector<LayerWeights>& layers, const ModelDims& dims,
                             LayerRange range);
// `model` with only the tensors an engine of `options`' layer range reads: its layers', the
// embedding on the first (and on the last when tied to the lm_head), the final norm, lm_head and
// the other non-layer tensors (the MTP head's) on the last. EngineError for a range outside the
// model, or one that splits the model with the MTP head asked for (it needs both ends).
ModelDesc keep_layer_range(ModelDesc model, const EngineOptions& options);

}  // namespace mq::engine
