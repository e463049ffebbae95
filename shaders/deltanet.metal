// The Gated DeltaNet mixer core (bodies: deltanet.h).
#include "deltanet.h"
#include "instances.h"

MQ_DELTANET_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
