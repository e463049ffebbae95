// Layout invariants every kernel relies on.
#pragma once

// Threads in a SIMD-group on Apple GPUs (and in the CPU runtime).
#define MQ_SIMD_WIDTH 32
