// Parameters of shaders/attention.metal.
#pragma once
