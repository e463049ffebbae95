// The plain description of a checkpoint that Python validates and hands over:
// sizes, layer kinds, and where every tensor lives (file, byte offset, dtype, shape).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mq::engine {

struct TensorDesc {
  std::string file;
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t nbytes = 0;
  std::string dtype;  // safetensors tag: U32, U8, BF16, F16, F32
  std::vector<int64_t> shape;
  int bits = 0;  // quantized modules only
  int group = 0;
  std::string mode;  // quantized modules only: affine, mxfp4, nvfp4, mxfp8
  // Added to every element at load (then placed as an f32 copy): 1 for the MTP norms of
  // folders that store them unshifted (w, used as 1 + w); 0 for every other tensor.
  float add = 0.0f;
};

struct ModelDims {
  int hidden = 0, layers = 0, intermediate = 0, vocab = 0;
  int heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 0;
  float eps = 1e-6f, rope_theta = 1e7f;
  bool tied = false;
  // Sparse MoE MLP in every layer when experts > 0 (then `intermediate` is unused): the
  // router picks experts_per_token of `experts`, each of moe_intermediate; plus a shared
  // expert of shared_intermediate. norm_top_k renormalises the chosen experts' weights.
  int experts = 0, experts_per_token = 0, moe_intermediate = 0, shared_intermediate = 0;
  bool norm_top_k = true;
  std::vector<bool> full_attention;  // per layer
  // Multimodal RoPE (Qwen3.5's interleaved M-RoPE): rotary pairs per (time, height, width)
  // position component; all zero for text-only descriptions (every pair then takes time).
  int mrope_section[3] = {0, 0, 0};
};

// A DFlash drafter (issue 28; math in dflash.h): Qwen3 decoder layers over the target's hidden
// states at target_layer_ids. layers == 0: none loaded.
struct DrafterDims {
  int hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int block_size = 0;     // the block it was trained on (a block of k + 1 rows drafts k tokens)
  int mask_token_id = 0;  // embedded at the block's rows after the first
  float eps = 1e-6f, rope_theta = 1e6f;
  std::vector<int> target_layer_ids;  // the target layers whose outputs it reads, in column order
};

struct ModelDesc {
  ModelDims dims;
  // Full tensor names as the MLX conversion writes them (language_model.model.*); a drafter's
  // under "dflash." (fc.weight, layers.N.*, ...).
  std::map<std::string, TensorDesc> tensors;
  DrafterDims drafter;
};

// Which trunk state the MTP head reads as h[t] (see mtp.h).
enum class MtpHidden { post_norm, pre_norm };

struct EngineOptions {
  int max_context = 4096;
  int kv_bits = 8;          // 8: q8 cache; 16: f16 cache
  int prefill_chunk = 64;   // rows per prefill step
  // Drafts per speculative verify step (0: none; snapshot planes are sized for it); from 8 on, steps
  // take up to MQ_QMV_MAX_ROWS rows and the deep verify kernels are built (max_step_rows, workspace.h).
  int max_draft = 0;
  bool mtp = false;         // load the MTP head (mtp.* tensors) with its KV cache
  MtpHidden mtp_hidden = MtpHidden::post_norm;
  int max_sequences =
      1;    // sequence slots: each has its own KV cache, DeltaNet state and ids (each Engine call names its slot)
  // Layers per command buffer of a prefill step (its last buffer also holds the output, the MTP
  // head and snapshot copies): macOS stops a buffer that holds the GPU too long.
  int prefill_layers_per_buffer = 8;
  // Pipeline parallelism: the engine runs layers [first_layer, end_layer) (end_layer -1: to the
  // last) and holds only their tensors; the first layer's also embeds, the last's the final
  // norm, lm_head and choice (Engine::embeds, Engine::has_head).
  int first_layer = 0;
  int end_layer = -1;
  // Bytes of weights placed beside the engine on its device (the vision tower's, vision.h): not
  // placed by the engine, but counted in its memory estimate and weight_bytes.
  uint64_t beside_weight_bytes = 0;
};

// [first, end) of the layers `options` asks for, end resolved.
struct LayerRange {
  int first = 0, end = 0;
  bool whole(const ModelDims& d) const { return first == 0 && end == d.layers; }
};
inline LayerRange layer_range(const ModelDims& d, const EngineOptions& o) {
  return {o.first_layer, o.end_layer < 0 ? d.layers : o.end_layer};
}

}  // namespace mq::engine
