// The projection kernels (bodies: quant.h) for every weight format.
#include "quant.h"
#include "instances.h"

#define MQ_QUANT_INSTANCES(F, ...) MQ_QUANT_FORMAT_KERNELS(MQ_INSTANTIATE, F, __VA_ARGS__)
MQ_WEIGHT_FORMATS(MQ_QUANT_INSTANCES)
