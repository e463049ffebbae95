// Kernel parameter structs, shared by the MSL kernels and the C++ engine so the
// argument layout cannot drift. Sizes reach kernels only through these structs.
// Each subsystem keeps its structs in params/<subsystem>.h.
#pragma once
#ifndef __METAL_VERSION__
#include <cstdint>
using uint = uint32_t;
#endif

#include "params/common.h"
#include "params/quant.h"
#include "params/norm.h"
#include "params/attention.h"
#include "params/deltanet.h"
#include "params/sampling.h"
#include "params/copy.h"
#include "params/moe.h"
#include "params/vision.h"
#include "params/dflash.h"
