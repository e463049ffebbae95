// DeltaNet's out_proj with the gated norm's factor folded in (bodies: qmv_head_norm.h) for every
// weight format.
#include "qmv_head_norm.h"
#include "instances.h"

#define MQ_QMV_HEAD_NORM_INSTANCES(F, ...) MQ_QMV_HEAD_NORM_FORMAT_KERNELS(MQ_INSTANTIATE, F, __VA_ARGS__)
MQ_WEIGHT_FORMATS(MQ_QMV_HEAD_NORM_INSTANCES)
