// Parameters of shaders/copy.metal: small strided copies and fills of 32-bit elements
// (f32 activations, u32 token ids) that the engine needs between kernels.
#pragma once

// copy_{f32,u32}: dst[dst_offset + r*dst_stride + i] = src[src_offset + r*src_stride + i]
// for i < cols, r < rows (offsets and strides in elements). Dispatch threads
// (cols, rows) (dispatchThreads, any threadgroup shape) or threadgroups covering them:
// the kernels guard the edges. src and dst ranges must not overlap.
struct CopyParams {
  uint cols;
  uint rows;
  uint src_offset;
  uint src_stride;
  uint dst_offset;
  uint dst_stride;
};

// fill_{f32,u32}: dst[dst_offset + r*dst_stride + i] = value for i < cols, r < rows.
// value_bits is the element's 32-bit pattern (for f32 the IEEE bits of the value, so
// NaN and -0.0 fill exactly). Dispatch as for the copy.
struct FillParams {
  uint cols;
  uint rows;
  uint dst_offset;
  uint dst_stride;
  uint value_bits;
};
