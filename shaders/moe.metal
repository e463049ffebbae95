// The MoE MLP's kernels (bodies: moe.h): routing and grouping, and the expert projections for
// every weight format.
#include "moe.h"
#include "instances.h"

MQ_MOE_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
#define MQ_MOE_INSTANCES(F, ...) MQ_MOE_FORMAT_KERNELS(MQ_INSTANTIATE, F, __VA_ARGS__)
MQ_WEIGHT_FORMATS(MQ_MOE_INSTANCES)
