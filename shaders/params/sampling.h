// Parameters of shaders/sampling.metal.
#pragma once
