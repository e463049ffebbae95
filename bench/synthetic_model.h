// A checkpoint description of a model shape with every weight zero, in one sparse file:
// the engine loads it like a real 4-bit MLX checkpoint (same tensors, formats and sizes)
// and runs the same dispatches at the same sizes, without a download.
#pragma once
#include <string>

#include "engine/model_desc.h"

namespace mq::bench {

// Writes `path` (holes only: no disk space, zero pages when read) and describes its tensors
// at the MLX conversion's names: projections and embeddings affine 4-bit, group 64 (the MoE
// router and shared-expert gate 8-bit, as mlx-lm quantizes them), vectors bf16, A_log f32.
// Throws std::runtime_error naming the file when it cannot be written.
engine::ModelDesc synthetic_model(const engine::ModelDims& dims, const std::string& path);

}  // namespace mq::bench
