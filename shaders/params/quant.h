// Parameters of shaders/quant.metal.
#pragma once
