// Token selection (bodies: sampling.h).
#include "sampling.h"
#include "instances.h"

MQ_SAMPLING_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
