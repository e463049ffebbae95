// Loading a layer's weights and counting a decode step's weight bytes, from the tables of
// layer_tensors.h.
#include "layer_tensors.h"

#include "errors.h"

namespace mq::engine {
namespace {

const std::string kModel = "language_model.model.";

template <class W, size_t N>
void load_part(W& part, const LayerTensor<W> (&table)[N], const Weights& w, const std::string& prefix) {
  for (const LayerTensor<W>& t : table) {
    if (t.linear) part.*t.linear = w.linear(prefix + t.name);
    else part.*t.vector = w.tensor(prefix + t.name);
  }
}

template <class W, size_t N>
W load_part(const LayerTensor<W> (&table)[N], const Weights& w, const std::string& prefix) {
  W part{};
  load_part(part, table, w, prefix);
  return part;
}

// Bytes of `part` a decode step reads: every tensor whole, but experts_per_token of each expert stack.
template <class W, size_t N>
uint64_t decode_bytes(const W& part, const LayerTensor<W> (&table)[N], const ModelDims& dims) {
  uint64_t total = 0;
  for (const LayerTensor<W>& t : table) {
    if (!t.linear) total += (part.*t.vector).desc->nbytes;
    else if (t.role == TensorRole::experts)
      total += uint64_t(dims.experts_per_token) * (part.*t.linear).expert_nbytes();
    else total += (part.*t.linear).nbytes();
  }
  return total;
}

}  // namespace

LayerWeights load_layer(const Weights& w, const ModelDims& dims, const std::string& p, bool full_attention) {
  LayerWeights l;
  l.full_attention = full_attention;
  load_part(l, kLayerNorms, w, p);
  if (dims.experts > 0) {
    l.moe = load_part(kMoeTensors, w, p + "mlp.");
    load_part(l.moe->shared_expert, kMlpTensors, w, p + "mlp.shared_expert.");
  } else {
    l.mlp = load_part(kMlpTensors, w, p + "mlp.");
  }
  if (full_attention) l.attn = load_part(kAttentionTensors, w, p + "self_attn.");
  else l.delta = load_part(kDeltaNetTensors, w, p + "linear_attn.");
  return l;
}

std::vector<LayerWeights> load_layers(const Weights& w, const ModelDims& dims, LayerRange range) {
  std::vector<LayerWeights> layers;
  for (int i = range.first; i < range.end; ++i)
    layers.push_back(load_layer(w, dims, kModel + "layers." + std::to_string(i) + ".", dims.full_attention[size_t(i)]));
  return layers;
}

uint64_t decode_weight_bytes(const Weights& w, const std::vector<LayerWeights>& layers, const ModelDims& dims,
                             LayerRange range) {
  uint64_t total = 0;
  if (range.end == dims.layers) {
    const std::string head = dims.tied ? kModel + "embed_tokens" : "language_model.lm_head";
    total += w.tensor(kModel + "norm.weight").desc->nbytes + w.linear(head).nbytes();
  }
  // The embedding gather reads one table row.
  if (range.first == 0) total += w.linear(kModel + "embed_tokens").nbytes() / uint64_t(dims.vocab);
  for (const LayerWeights& l : layers) {
    total += decode_bytes(l, kLayerNorms, dims);
    if (l.moe) total += decode_bytes(*l.moe, kMoeTensors, dims) + decode_bytes(l.moe->shared_expert, kMlpTensors, dims);
    else total += decode_bytes(*l.mlp, kMlpTensors, dims);
    total += l.attn ? decode_bytes(*l.attn, kAttentionTensors, dims) : decode_bytes(*l.delta, kDeltaNetTensors, dims);
  }
  return total;
}

ModelDesc keep_layer_range(ModelDesc model, const EngineOptions& options) {
  const ModelDims& d = model.dims;
  const LayerRange range = layer_range(d, options);
  if (range.first < 0 || range.first >= range.end || range.end > d.layers)
    throw EngineError("[engine] layers [" + std::to_string(range.first) + ", " + std::to_string(range.end) +
                      ") are not a non-empty range of the model's " + std::to_string(d.layers) + " layers");
  if (range.whole(d)) return model;
  const bool first = range.first == 0, last = range.end == d.layers;
  if (options.mtp && !last)
    throw EngineError("[engine] the MTP head goes with the lm_head (the last layers' engine): not with layers [" +
                      std::to_string(range.first) + ", " + std::to_string(range.end) + ") of " +
                      std::to_string(d.layers));
  const std::string layer_prefix = kModel + "layers.", embed = kModel + "embed_tokens.";
  auto keep = [&](const std::string& name) {
    if (name.rfind(layer_prefix, 0) == 0) {
      const int layer = std::stoi(name.substr(layer_prefix.size()));
      return layer >= range.first && layer < range.end;
    }
    if (name.rfind(embed, 0) == 0) return first || (last && (d.tied || options.mtp));  // the MTP head embeds
    return last;  // the final norm, lm_head, MTP head
  };
  std::erase_if(model.tensors, [&](const auto& entry) { return !keep(entry.first); });
  return model;
}

}  // namespace mq::engine
