// Parameters of shaders/vision.metal: the Qwen3-VL vision tower of Qwen3.5 (docs/images.md).
// Activations f32 [rows][stride]; rows are one image's patches in the merger's order (each
// 2 x 2 block of neighbouring patches on 4 consecutive rows).
#pragma once

// vision_linear: y = x W^T + b over tiles of MQ_VISION_TILE rows x MQ_VISION_TILE outputs,
// K in steps of MQ_VISION_TILE; dispatch (ceil(out / TILE), ceil(rows / TILE)) threadgroups of
// MQ_VISION_LINEAR_THREADS threads (each TILE * TILE / THREADS outputs of one column).
#define MQ_VISION_TILE 32
#define MQ_VISION_LINEAR_THREADS 256
// vision_bias: a grid of threads, threadgroups of up to this many.
#define MQ_VISION_BIAS_THREADS 256
// vision_layer_norm: one threadgroup per row, any multiple of 32 threads up to 1024.
#define MQ_VISION_NORM_THREADS 256
// vision_attention: a lane holds head dims lane + 32 j, j < MQ_VISION_MAX_HEAD_DIM / 32.
#define MQ_VISION_MAX_HEAD_DIM 128

// y [rows][y_stride] = act(x [rows][x_stride] . W [out][in]^T + b [out]), or y += that (the
// residual variants). in, out, strides: any sizes >= 1 (edges guarded).
struct VisionLinearParams {
  uint rows;
  uint in;
  uint out;
  uint x_stride;  // floats from one row of x to the next
  uint y_stride;
};

// vision_bias: a quantized linear's bias and epilogue after the projections' qmm wrote
// t [rows][t_stride] = x W^T: y [rows][y_stride] = act(t + b), or y += t + b.
// Dispatch threads (out, rows).
struct VisionBiasParams {
  uint rows;
  uint out;
  uint t_stride;
  uint y_stride;
};

// y = (x - mean) * rsqrt(var + eps) * w + b per row of dim (var = mean((x - mean)^2)).
struct VisionNormParams {
  uint dim;
  uint x_stride;
  uint y_stride;
  float eps;
};

// x [rows][hidden] = sum over c < 4 of weight[r][c] * pos_embed[index[r][c]] (the learned grid
// interpolated bilinearly to the image's patch grid; index/weight computed by the host).
// Dispatch threads (hidden, rows).
struct VisionPosEmbedParams {
  uint rows;
  uint hidden;
};

// In place on the q and k parts of qkv rows [rows][qkv_stride] (q at 0, k at heads * head_dim):
// pair (i, i + head_dim / 2) of each head turns by pos * inv_freq[i % (head_dim / 4)], pos the
// row's patch row for i < head_dim / 4, else its patch column (positions uint2 [rows]).
// Dispatch threads (head_dim / 2, heads, rows).
struct VisionRopeParams {
  uint rows;
  uint heads;
  uint head_dim;
  uint qkv_stride;
};

// Full (non-causal) attention of every row over rows [0, rows) of one image, per head:
// out [rows][out_stride] (head h at h * head_dim) from qkv rows [q | k | v]. One SIMD-group per
// (row, head): dispatch (ceil(rows / simdgroups), heads) threadgroups.
struct VisionAttentionParams {
  uint rows;
  uint heads;
  uint head_dim;
  uint qkv_stride;
  uint out_stride;
  float scale;  // head_dim^-1/2
};
