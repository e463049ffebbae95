// RMSNorm, the MLP activation and the residual add (bodies: norm.h).
#include "norm.h"
#include "instances.h"

MQ_NORM_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
