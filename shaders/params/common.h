// Layout invariants every kernel relies on.
#pragma once

// Threads in a SIMD-group on Apple GPUs (and in the CPU runtime).
#define MQ_SIMD_WIDTH 32

// The sequences of a step: segment i owns rows [first_row, first_row + rows) of the step's
// activations, which are positions position .. position + rows - 1 of sequence slot `slot`.
// Segments are slot-major and contiguous (segment i+1's first_row = first_row + rows of i),
// count >= 1, every segment has rows >= 1, and no two segments share a slot (a slot's
// state, history ring and cache rows are written by its own segment only).
// Per-slot memory is one buffer per layer with a fixed stride per slot (slot-major):
// DeltaNet state [slots][n_v][D][D], conv history ring [slots][hist_slots][C], state
// snapshots [slots][snap planes][n_v][D][D], KV caches [slots][one slot's cache layout];
// the strides arrive in each kernel's params struct (never constants in kernels).
// Kernels that take the table compute every row exactly as they would with its segment
// alone in the step: a segment's results never depend on the other segments.
#define MQ_MAX_SEGMENTS 8
struct StepSegment {
  uint slot;       // sequence slot: index into the per-slot strides
  uint first_row;  // the segment's first row among the step's activation rows
  uint rows;       // rows >= 1
  uint position;   // absolute position of the segment's first row in its sequence
};
struct StepSegments {
  uint count;  // 1 .. MQ_MAX_SEGMENTS
  StepSegment seg[MQ_MAX_SEGMENTS];
};  // bound with setBytes (132 bytes)
