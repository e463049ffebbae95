// Parameters of shaders/norm.metal.
#pragma once
