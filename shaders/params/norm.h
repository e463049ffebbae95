// Parameters of shaders/norm.metal: RMSNorm (optionally fused with the residual add),
// the MLP activation silu(gate) * up, and the residual add.
#pragma once

// rms_norm, rms_norm_residual: one threadgroup per row, dispatch `rows` threadgroups of
// MQ_NORM_THREADS threads (any multiple of 32 up to 1024 works; the kernels read the
// group size). dim may be any size >= 1; the model's hidden sizes are multiples of 32.
#define MQ_NORM_THREADS 256

// y = x * rsqrt(mean(x^2) + eps) * w, w bf16 [dim] multiplied as stored (MLX checkpoints
// store the shifted 1 + w). rms_norm_residual first does x += r and normalises the sum.
struct RmsNormParams {
  uint dim;       // elements per row
  uint x_stride;  // floats from one row of x to the next
  uint r_stride;  // floats from one row of r to the next (residual variant only)
  uint y_stride;  // floats from one row of y to the next
  float eps;
};

// out[r][i] = silu(gate[r][i]) * up[r][i], i < n. gate and up may be the two halves of
// one fused projection row [gate(n) | up(n)]: bind the buffer twice, up at byte offset
// 4 * n, both strides 2 * n. Dispatch threads (ceil(n / 4), rows), any threadgroup
// shape. n and all strides must be multiples of 4 and the bindings 16-byte aligned
// (each thread moves a float4).
struct SiluMulParams {
  uint n;           // elements per row (intermediate size)
  uint rows;
  uint gate_stride; // floats from one row of gate to the next
  uint up_stride;
  uint out_stride;
};

// x[i] += r[i], i < n. Dispatch threads (ceil(n / 4)), any threadgroup size; any n
// (each thread moves a float4, the last one is guarded); bindings 16-byte aligned.
struct ResidualAddParams {
  uint n;
};
