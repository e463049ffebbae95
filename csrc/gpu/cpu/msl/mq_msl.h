// The MSL standard library for the CPU runtime: what `#include <metal_stdlib>` (and every
// other metal_* header) resolves to in the C++ the translator generates.
#pragma once
#include "msl_scalar.h"
#include "msl_traits.h"
#include "msl_limits.h"
#include "msl_vector.h"
#include "msl_elementwise.h"
#include "msl_integer.h"
#include "msl_math.h"
#include "msl_relational.h"
#include "msl_geometric.h"
#include "msl_sync.h"
#include "msl_simd.h"
#include "msl_matrix.h"
#include "msl_atomic.h"
#include "mq_kernel_glue.h"  // the translator's kernel entry glue, last: it may use all of the above
