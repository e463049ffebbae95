// Layout invariants every kernel relies on.
#pragma once

// Threads in a SIMD-group on Apple GPUs (and in the CPU runtime).
#define MQ_SIMD_WIDTH 32

// The sequences of a step: segment i owns rows [first_row, first_row + rows) of the step's
// activations, which are positions position .. position + rows - 1 of sequence slot `slot`.
// Segments are slot-major and contiguous (segment i+1's first_row = first_row + rows of i).
#define MQ_MAX_SEGMENTS 8
struct StepSegment { uint slot; uint first_row; uint rows; uint position; };
struct StepSegments { uint count; StepSegment seg[MQ_MAX_SEGMENTS]; };   // bound with setBytes
