// Gated full attention (bodies: attention.h).
#include "attention.h"
#include "instances.h"

MQ_ATTENTION_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
