// The norm-fused matvecs (bodies: qmv_norm.h) for every weight format.
#include "qmv_norm.h"
#include "instances.h"

#define MQ_QMV_NORM_INSTANCES(F, ...) MQ_QMV_NORM_FORMAT_KERNELS(MQ_INSTANTIATE, F, __VA_ARGS__)
MQ_WEIGHT_FORMATS(MQ_QMV_NORM_INSTANCES)
