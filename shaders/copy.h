// Small copies and fills of 32-bit elements between kernels (row slices, id buffers,
// zeroed states). Plain element moves: the bits are copied exactly, NaN included.
#pragma once
#include <metal_stdlib>
using namespace metal;
#include "params.h"

// dst[dst_offset + r*dst_stride + i] = src[src_offset + r*src_stride + i].
//   src, dst: T buffers (f32 or u32), layouts given by CopyParams (elements).
// Grid: threads (cols, rows) or more (guarded); any threadgroup shape.
template <typename T>  // 32-bit element type
[[kernel]] void copy_rows(device const T* src [[buffer(0)]],
                          device T* dst [[buffer(1)]],
                          constant CopyParams& p [[buffer(2)]],
                          uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  // Moved as uint whatever T is, so float data keeps its exact bits (NaN payloads too).
  device const uint* s = (device const uint*)src;
  device uint* d = (device uint*)dst;
  d[p.dst_offset + (ulong)pos.y * p.dst_stride + pos.x] = s[p.src_offset + (ulong)pos.y * p.src_stride + pos.x];
}

// dst[dst_offset + r*dst_stride + i] = the element with bits value_bits.
//   dst: T buffer (f32 or u32), layout given by FillParams (elements).
// Grid: threads (cols, rows) or more (guarded); any threadgroup shape.
template <typename T>  // 32-bit element type
[[kernel]] void fill_rows(device T* dst [[buffer(0)]],
                          constant FillParams& p [[buffer(1)]],
                          uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  ((device uint*)dst)[p.dst_offset + (ulong)pos.y * p.dst_stride + pos.x] = p.value_bits;  // exact bits
}

