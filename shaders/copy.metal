// Copies and fills (bodies: copy.h).
#include "copy.h"
#include "instances.h"

MQ_COPY_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
