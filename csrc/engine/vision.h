// The vision tower of Qwen3.5 (Qwen3-VL's, docs/images.md) on the GPU: one image's patches in,
// its merged features (the rows that replace the prompt's image-pad tokens) out, encoded in its
// own command buffers from shaders/vision.metal. Weights are placed by the language model's
// loader (Weights); activations are f32, in buffers sized per image.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "kernels.h"
#include "model_desc.h"
#include "weights.h"

namespace mq::engine {

struct VisionDims {
  int depth = 0, hidden = 0, intermediate = 0, heads = 0, out_hidden = 0;
  int patch = 0, temporal_patch = 0, merge = 0, in_channels = 0, position_embeddings = 0;
  float eps = 1e-6f;
  int head_dim() const { return heads ? hidden / heads : 0; }
  // Values per patch row: C * T * P * P.
  int patch_dim() const { return in_channels * temporal_patch * patch * patch; }
};

struct VisionDesc {
  VisionDims dims;
  // Full names as mlx-vlm writes them (vision_tower.*).
  std::map<std::string, TensorDesc> tensors;
};

class VisionTower {
 public:
  // Places the tensors, then compiles and creates the tower's kernels. Throws EngineError
  // naming the tensor or size at fault.
  VisionTower(std::shared_ptr<gpu::Device> device, VisionDesc desc, const Kernels::Progress& progress = {});
  const VisionDims& dims() const { return dims_; }
  // One still image's merged features [grid_h * grid_w / 4][out_hidden] from its patches
  // [grid_h * grid_w][C][T][P][P] f32 (the processor's rows, in the merger's order: each 2 x 2
  // block of neighbouring patches on 4 consecutive rows), grid_h and grid_w even.
  std::vector<float> features(const std::vector<float>& patches, int grid_h, int grid_w);
  // The same features left on the device: the buffer (f32 [rows][out_hidden], exactly that
  // size) a prompt's prefill takes as those rows' embeddings (PromptImages::Features).
  std::shared_ptr<gpu::Buffer> features_buffer(const std::vector<float>& patches, int grid_h, int grid_w);
  // Blocks per command buffer: macOS stops a buffer that holds the GPU too long.
  static constexpr int kBlocksPerBuffer = 4;

 private:
  // y = x W^T + b: the weight (any 2-D or, for the patch embedding, 5-D [out][...] layout read
  // as [out][in]), its bias, and per epilogue the pipelines of its format (float weights:
  // vision_linear_* of bf16, f16 or f32). A quantized weight (any format of the projections,
  // `quant`) runs the projections' qmm, then vision_bias_* of its bias' width adds the bias.
  struct Linear {
    DeviceTensor weight, bias;
    uint32_t in = 0, out = 0;
    std::string format;
    QuantLinear quant;  // quantized weights only (then weight == quant.weight)
    const Pipeline *plain = nullptr, *gelu_tanh = nullptr, *gelu_erf = nullptr, *residual = nullptr;
    const Pipeline* qmm = nullptr;
    bool quantized() const { return quant.weight.desc != nullptr; }
  };
  struct Norm {
    DeviceTensor weight, bias;
    const Pipeline* kernel = nullptr;
  };
  struct Block {
    Norm norm1, norm2;
    Linear qkv, proj, fc1, fc2;
  };
  Linear linear(const std::string& module, uint32_t in, uint32_t out) const;
  Norm norm(const std::string& module) const;
  void plan_linear(KernelPlan& plan, Linear& l);
  void plan_norm(KernelPlan& plan, Norm& n);

  std::shared_ptr<gpu::Device> device_;
  VisionDims dims_;
  ModelDesc tensors_;  // the tower's tensors (no language-model dims): weights_ points into it
  Weights weights_;
  Kernels kernels_;
  Linear patch_embed_, merger_fc1_, merger_fc2_;
  Norm merger_norm_;
  DeviceTensor pos_embed_;
  // A quantized position grid: its rows are gathered by the projections' embed kernel into f32
  // first (pos_gather_), then weighted by vision_pos_embed_f32.
  QuantLinear pos_quant_;
  std::vector<Block> blocks_;
  const Pipeline *pos_embed_kernel_ = nullptr, *pos_gather_ = nullptr, *rope_ = nullptr, *attention_ = nullptr;
};

}  // namespace mq::engine
