// The checkpoint description's tensor entries (checkpoint.py's describe()) as the engine's
// TensorDesc: name -> (file, offset, nbytes, dtype, shape, bits, group, mode[, add]).
#pragma once
#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "engine/model_desc.h"

std::map<std::string, mq::engine::TensorDesc> to_tensor_descs(const pybind11::dict& tensors);
