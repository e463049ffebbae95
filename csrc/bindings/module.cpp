// metalqwen._core: thin pybind11 wrappers over the C++ core; no logic here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <set>

#include "../../shaders/params.h"
#include "engine/errors.h"
#include "engine/shader_source.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/cpu/msl_check.h"
#include "gpu/device.h"

namespace py = pybind11;
using namespace mq::gpu;

namespace {

Size3 size3(const std::tuple<uint32_t, uint32_t, uint32_t>& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t)};
}

void bind_gpu(py::module_& m) {
  m.def("available_device_kinds", &available_device_kinds);
  m.def("metal_unavailable_reason", &metal_unavailable_reason);
  m.def("open_device", &open_device, py::arg("kind"));
  m.def("open_cpu_device", &open_cpu_device, py::arg("schedule") = "", py::arg("checks") = std::vector<std::string>{});

  py::class_<Buffer, std::shared_ptr<Buffer>>(m, "Buffer", py::buffer_protocol())
      .def_property_readonly("nbytes", &Buffer::size)
      .def_buffer([](Buffer& b) {
        return py::buffer_info(b.contents(), 1, py::format_descriptor<uint8_t>::format(), 1, {b.size()}, {1});
      });

  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel")
      .def_property_readonly("name", &Kernel::name)
      .def_property_readonly("max_threads_per_threadgroup", &Kernel::max_threads_per_threadgroup)
      .def_property_readonly("thread_execution_width", &Kernel::thread_execution_width);

  py::class_<Library, std::shared_ptr<Library>>(m, "Library")
      .def("kernel", &Library::kernel, py::arg("name"))
      .def("kernel_names", &Library::kernel_names);

  py::class_<CommandBuffer>(m, "CommandBuffer")
      .def("set_kernel", &CommandBuffer::set_kernel)
      .def("set_buffer", &CommandBuffer::set_buffer, py::arg("index"), py::arg("buffer"), py::arg("offset"))
      .def("set_bytes",
           [](CommandBuffer& cb, uint32_t index, py::buffer data) {
             py::buffer_info info = data.request();
             cb.set_bytes(index, info.ptr, size_t(info.size * info.itemsize));
           })
      .def("set_threadgroup_memory", &CommandBuffer::set_threadgroup_memory)
      .def("dispatch_threadgroups",
           [](CommandBuffer& cb, std::tuple<uint32_t, uint32_t, uint32_t> groups,
              std::tuple<uint32_t, uint32_t, uint32_t> threads) {
             cb.dispatch_threadgroups(size3(groups), size3(threads));
           })
      .def("dispatch_threads",
           [](CommandBuffer& cb, std::tuple<uint32_t, uint32_t, uint32_t> grid,
              std::tuple<uint32_t, uint32_t, uint32_t> threads) { cb.dispatch_threads(size3(grid), size3(threads)); })
      .def("barrier", &CommandBuffer::barrier)
      .def("commit", &CommandBuffer::commit)
      .def("wait", &CommandBuffer::wait, py::call_guard<py::gil_scoped_release>())
      .def("gpu_seconds", &CommandBuffer::gpu_seconds);

  py::class_<Device, std::shared_ptr<Device>>(m, "Device")
      .def_property_readonly("kind", &Device::kind)
      .def_property_readonly("name", &Device::name)
      .def_property_readonly("max_buffer_length", &Device::max_buffer_length)
      .def_property_readonly("recommended_working_set", &Device::recommended_working_set)
      .def_property_readonly("gpu_cores", &Device::gpu_cores)
      .def(
          "new_buffer", [](Device& d, size_t nbytes) { return d.new_buffer(nbytes); }, py::arg("nbytes"))
      .def_property_readonly("resident",
                             [](const Device& d) {
                               const mq::gpu::Residency r = d.resident();
                               return std::make_pair(r.buffers, r.bytes);
                             })
      .def("compile", &Device::compile, py::arg("source"), py::arg("name"), py::call_guard<py::gil_scoped_release>())
      .def("compile_notice", &Device::compile_notice, py::arg("source"), py::arg("name"))
      .def("new_command_buffer", &Device::new_command_buffer);

  m.def("check_msl", &mq::cpu::check_msl, py::arg("source"), py::arg("name"), py::call_guard<py::gil_scoped_release>());
}

void bind_shaders(py::module_& m) {
  m.def(
      "shader_library_source",
      [](std::optional<std::map<std::string, std::string>> files, std::optional<std::set<std::string>> kernels) {
        const auto& sources = files ? *files : mq::engine::embedded_shader_files();
        return kernels ? mq::engine::assemble_kernel_library(sources, *kernels)
               : files ? mq::engine::assemble_shader_library(sources)
                       : mq::engine::embedded_shader_library();
      },
      py::arg("files") = py::none(), py::arg("kernels") = py::none(),
      "The shader library as one MSL text; `files` (path under shaders/ -> text) replaces the built-in copy, "
      "`kernels` (host names) keeps only those kernels, as the engine compiles a model's.");
  m.def("kernel_names", &mq::engine::kernel_names, "Every kernel host name of the shader library.");
  m.def("shader_library_key", &mq::engine::embedded_shader_key,
        "The embedded shader files' key, which a prebuilt Metal library must hold (tools/shader_key.cmake).");
  m.def("weight_formats", &mq::engine::weight_formats,
        "The host-name suffix of every projection weight format the kernels are instantiated for.");
  // Limits the kernels are built for (shaders/params/*.h), read by the Python layer's checks.
  m.attr("MAX_STEP_ROWS") = MQ_QMV_MAX_ROWS;       // rows of a verify or shared step (matvec path, deep tier)
  m.attr("SMALL_STEP_ROWS") = MQ_QMV_SMALL_ROWS;   // ... of an engine loaded with max_draft < SMALL_STEP_ROWS
  m.attr("MAX_DRAFT") = MQ_QMV_MAX_ROWS - 1;       // drafts of one verify step: its rows less the chosen token
  m.attr("MAX_SEQUENCES") = MQ_MAX_SEGMENTS;       // sequence slots, each a segment of a shared step
  m.attr("MAX_TOP_LOGPROBS") = MQ_LOGPROB_MAX_TOP;  // top entries per token of the logprobs kernel
  m.attr("MAX_LOGIT_BIAS") = MQ_LOGIT_BIAS_MAX;     // entries of a request's logit_bias table
  m.attr("MAX_EXPERTS") = MQ_MOE_MAX_EXPERTS;      // experts the MoE router kernel takes
  m.attr("MAX_EXPERTS_PER_TOKEN") = MQ_MOE_MAX_TOP_K;
  m.attr("MAX_VISION_HEAD_DIM") = MQ_VISION_MAX_HEAD_DIM;  // the vision tower's attention kernel
}

// C++ errors become metalqwen.errors classes: GpuError, CompileError (with .diagnostics),
// ContextFullError, and EngineError for every other runtime failure of the core.
void translate_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CompileError& e) {
      py::object errors = py::module_::import("metalqwen.errors");
      py::object exc = errors.attr("CompileError")(e.what(), e.diagnostics());
      PyErr_SetObject(errors.attr("CompileError").ptr(), exc.ptr());
    } catch (const GpuError& e) {
      PyErr_SetString(py::module_::import("metalqwen.errors").attr("GpuError").ptr(), e.what());
    } catch (const mq::engine::ContextFull& e) {
      PyErr_SetString(py::module_::import("metalqwen.errors").attr("ContextFullError").ptr(), e.what());
    } catch (const py::builtin_exception&) {
      throw;  // pybind11's own translation (ValueError, ...)
    } catch (const std::runtime_error& e) {
      // mq::engine::EngineError and any other failure of the core
      PyErr_SetString(py::module_::import("metalqwen.errors").attr("EngineError").ptr(), e.what());
    }
  });
}

}  // namespace

void bind_engine(py::module_& m);  // engine.cpp
void bind_vision(py::module_& m);  // vision.cpp

PYBIND11_MODULE(_core, m) {
  m.doc() = "metalqwen native core";
  translate_errors();
  bind_gpu(m);
  bind_shaders(m);
  bind_engine(m);
  bind_vision(m);
}
