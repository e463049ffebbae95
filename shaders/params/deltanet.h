// Parameters of shaders/deltanet.metal.
#pragma once
