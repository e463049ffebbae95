// The vision tower: linears with bias and epilogue, LayerNorm, the position grid, 2-D RoPE and
// attention within one image (bodies: vision.h).
#include "vision.h"
#include "instances.h"

MQ_VISION_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
