// The DFlash drafter's kernels (bodies: dflash.h).
#include "dflash.h"
#include "instances.h"

MQ_DFLASH_KERNELS(MQ_INSTANTIATE, MQ_DEFINED_IN_HEADER)
