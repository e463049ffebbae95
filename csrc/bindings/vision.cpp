// metalqwen._core.VisionTower: the vision tower (engine/vision.h) from the checkpoint's
// description (vision_checkpoint.py); numpy patches in, merged features out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>

#include "engine/vision.h"
#include "tensor_descs.h"

namespace py = pybind11;
using namespace mq::engine;

namespace {

int dim(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::runtime_error(std::string("[vision] tower description lacks '") + key + "'");
  return d[key].cast<int>();
}

VisionDesc to_vision_desc(const py::dict& dims, const py::dict& tensors) {
  VisionDesc v;
  VisionDims& d = v.dims;
  d.depth = dim(dims, "depth");
  d.hidden = dim(dims, "hidden_size");
  d.intermediate = dim(dims, "intermediate_size");
  d.heads = dim(dims, "num_heads");
  d.out_hidden = dim(dims, "out_hidden_size");
  d.patch = dim(dims, "patch_size");
  d.temporal_patch = dim(dims, "temporal_patch_size");
  d.merge = dim(dims, "spatial_merge_size");
  d.in_channels = dim(dims, "in_channels");
  d.position_embeddings = dim(dims, "num_position_embeddings");
  if (dims.contains("layer_norm_eps")) d.eps = dims["layer_norm_eps"].cast<float>();
  v.tensors = to_tensor_descs(tensors);
  return v;
}

}  // namespace

void bind_vision(py::module_& m) {
  py::class_<VisionTower>(m, "VisionTower")
      .def(py::init([](std::shared_ptr<mq::gpu::Device> device, const py::dict& dims, const py::dict& tensors) {
             VisionDesc desc = to_vision_desc(dims, tensors);
             py::gil_scoped_release release;
             return std::make_unique<VisionTower>(std::move(device), std::move(desc));
           }),
           py::arg("device"), py::arg("dims"), py::arg("tensors"))
      // patches: float32 [grid_h * grid_w, C*T*P*P] (the processor's rows); returns [rows / 4, out_hidden].
      .def(
          "features",
          [](VisionTower& t, py::array_t<float, py::array::c_style | py::array::forcecast> patches, int grid_h,
             int grid_w) {
            std::vector<float> in(patches.data(), patches.data() + patches.size());
            std::vector<float> out;
            {
              py::gil_scoped_release release;
              out = t.features(in, grid_h, grid_w);
            }
            const size_t width = size_t(t.dims().out_hidden);
            py::array_t<float> a({out.size() / width, width});
            std::copy(out.begin(), out.end(), a.mutable_data());
            return a;
          },
          py::arg("patches"), py::arg("grid_h"), py::arg("grid_w"))
      // The same, left on the device: a Buffer of f32 [rows / 4][out_hidden] for Engine.prefill's images.
      .def(
          "features_buffer",
          [](VisionTower& t, py::array_t<float, py::array::c_style | py::array::forcecast> patches, int grid_h,
             int grid_w) {
            std::vector<float> in(patches.data(), patches.data() + patches.size());
            py::gil_scoped_release release;
            return t.features_buffer(in, grid_h, grid_w);
          },
          py::arg("patches"), py::arg("grid_h"), py::arg("grid_w"));
}
