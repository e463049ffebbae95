// metalqwen._core.Engine: converts the Python checkpoint description to the
// engine's plain structs and forwards calls; numpy in and out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <set>

#include "engine/engine.h"

namespace py = pybind11;
using namespace mq::engine;

namespace {

template <class T>
T field(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::runtime_error(std::string("[engine] model description lacks '") + key + "'");
  return d[key].cast<T>();
}

ModelDesc to_model_desc(const py::dict& dims, const py::dict& tensors) {
  ModelDesc m;
  ModelDims& d = m.dims;
  d.hidden = field<int>(dims, "hidden_size");
  d.layers = field<int>(dims, "num_hidden_layers");
  d.intermediate = field<int>(dims, "intermediate_size");
  d.vocab = field<int>(dims, "vocab_size");
  d.heads = field<int>(dims, "num_attention_heads");
  d.kv_heads = field<int>(dims, "num_key_value_heads");
  d.head_dim = field<int>(dims, "head_dim");
  d.rotary_dim = field<int>(dims, "rotary_dim");
  d.lin_k_heads = field<int>(dims, "linear_num_key_heads");
  d.lin_v_heads = field<int>(dims, "linear_num_value_heads");
  d.lin_k_dim = field<int>(dims, "linear_key_head_dim");
  d.lin_v_dim = field<int>(dims, "linear_value_head_dim");
  d.conv_kernel = field<int>(dims, "linear_conv_kernel_dim");
  d.eps = field<float>(dims, "rms_norm_eps");
  d.rope_theta = field<float>(dims, "rope_theta");
  d.tied = field<bool>(dims, "tie_word_embeddings");
  d.experts = field<int>(dims, "num_experts");
  if (d.experts > 0) {
    d.experts_per_token = field<int>(dims, "num_experts_per_tok");
    d.moe_intermediate = field<int>(dims, "moe_intermediate_size");
    d.shared_intermediate = field<int>(dims, "shared_expert_intermediate_size");
    d.norm_top_k = field<bool>(dims, "norm_topk_prob");
  }
  for (const auto& kind : field<std::vector<std::string>>(dims, "layer_types")) d.full_attention.push_back(kind == "full_attention");
  if (int(d.full_attention.size()) != d.layers) throw std::runtime_error("[engine] layer_types does not match num_hidden_layers");
  for (const auto& [name, entry] : tensors) {
    auto e = entry.cast<py::tuple>();  // (file, offset, nbytes, dtype, shape, bits, group, mode[, add])
    TensorDesc t;
    t.file = e[0].cast<std::string>();
    t.offset = e[1].cast<uint64_t>();
    t.nbytes = e[2].cast<uint64_t>();
    t.dtype = e[3].cast<std::string>();
    t.shape = e[4].cast<std::vector<int64_t>>();
    t.bits = e[5].is_none() ? 0 : e[5].cast<int>();
    t.group = e[6].is_none() ? 0 : e[6].cast<int>();
    t.mode = e[7].is_none() ? "" : e[7].cast<std::string>();
    if (e.size() > 8) t.add = e[8].cast<float>();
    m.tensors[name.cast<std::string>()] = std::move(t);
  }
  return m;
}

// prefill and decode_begin take the Sampling fields as keyword arguments, neutral by default.
Sampling sampling(float temperature, int top_k, float top_p, float min_p, float presence_penalty,
                  float frequency_penalty, float repetition_penalty, uint64_t seed, int logprobs) {
  return {temperature, top_k, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty, seed, logprobs};
}
#define MQ_SAMPLING_ARGS                                                                                     \
  py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("min_p") = 0.0f, \
      py::arg("presence_penalty") = 0.0f, py::arg("frequency_penalty") = 0.0f,                            \
      py::arg("repetition_penalty") = 1.0f, py::arg("seed") = 0, py::arg("logprobs") = -1

}  // namespace

void bind_engine(py::module_& m) {
  // Device memory holding a sequence state (see engine.h); Engine.restore puts it back.
  py::class_<Snapshot, std::shared_ptr<Snapshot>>(m, "Snapshot")
      .def_readonly("position", &Snapshot::position)
      .def_readonly("tokens", &Snapshot::tokens)
      .def_property_readonly("nbytes", &Snapshot::nbytes);
  py::class_<Engine>(m, "Engine")
      .def(py::init([](std::shared_ptr<mq::gpu::Device> device, py::dict dims, py::dict tensors, int max_context,
                       int kv_bits, int prefill_chunk, int max_draft, py::object progress, bool mtp,
                       const std::string& mtp_hidden, int max_sequences, int prefill_layers_per_buffer) {
             if (mtp_hidden != "post_norm" && mtp_hidden != "pre_norm")
               throw py::value_error("mtp_hidden must be 'post_norm' or 'pre_norm'");
             ModelDesc desc = to_model_desc(dims, tensors);
             // progress(stage, done, total, note): stage "weights" (bytes) or "kernels" (pipelines).
             LoadProgress report;
             if (!progress.is_none()) {
               report.weights = [progress](uint64_t done, uint64_t total) {
                 py::gil_scoped_acquire acquire;
                 progress("weights", done, total, "");
               };
               report.kernels = [progress](uint64_t done, uint64_t total, const std::string& note) {
                 py::gil_scoped_acquire acquire;
                 progress("kernels", done, total, note);
               };
             }
             py::gil_scoped_release release;
             const EngineOptions options{max_context, kv_bits, prefill_chunk, max_draft, mtp,
                                         mtp_hidden == "pre_norm" ? MtpHidden::pre_norm : MtpHidden::post_norm,
                                         max_sequences, prefill_layers_per_buffer};
             return std::make_unique<Engine>(std::move(device), std::move(desc), options, report);
           }),
           py::arg("device"), py::arg("dims"), py::arg("tensors"), py::arg("max_context"), py::arg("kv_bits"),
           py::arg("prefill_chunk"), py::arg("max_draft") = 0, py::arg("progress") = py::none(),
           py::arg("mtp") = false, py::arg("mtp_hidden") = "post_norm", py::arg("max_sequences") = 1,
           py::arg("prefill_layers_per_buffer") = EngineOptions{}.prefill_layers_per_buffer)
      .def("select", &Engine::select, py::arg("slot"))
      .def_property_readonly("slot", &Engine::slot)
      .def_property_readonly("max_sequences", &Engine::max_sequences)
      .def("reset", &Engine::reset)
      .def_property_readonly("position", &Engine::position)
      .def_property_readonly("max_context", &Engine::max_context)
      .def("tokens", &Engine::tokens)
      .def(
          "prefill",
          [](Engine& e, std::vector<uint32_t> tokens, float temperature, int top_k, float top_p, float min_p,
             float presence_penalty, float frequency_penalty, float repetition_penalty, uint64_t seed,
             int logprobs, const std::string& logits, py::object progress, std::vector<int> snapshot_at,
             py::object snapshots) -> py::object {
            if (logits != "none" && logits != "last" && logits != "all")
              throw py::value_error("logits must be 'none', 'last' or 'all'");
            // Between chunks: a pending Ctrl-C raises KeyboardInterrupt here (the chunks
            // submitted stay fed), then progress(done, total) if given.
            const PrefillProgress between_chunks = [&progress](size_t done, size_t total) {
              py::gil_scoped_acquire acquire;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (!progress.is_none()) progress(done, total);
            };
            std::vector<float> out;
            std::vector<std::shared_ptr<Snapshot>> taken;
            {
              py::gil_scoped_release release;
              out = e.prefill(tokens,
                              sampling(temperature, top_k, top_p, min_p, presence_penalty, frequency_penalty,
                                       repetition_penalty, seed, logprobs),
                              logits == "all", logits == "last", between_chunks, snapshot_at, &taken);
            }
            if (!snapshots.is_none())
              for (auto& s : taken) snapshots.attr("append")(s);
            if (logits == "none") return py::none();
            const size_t vocab = size_t(e.dims().vocab);
            py::array_t<float> a({out.size() / vocab, vocab});
            std::copy(out.begin(), out.end(), a.mutable_data());
            return a;
          },
          py::arg("tokens"), MQ_SAMPLING_ARGS, py::arg("logits") = "none", py::arg("progress") = py::none(),
          py::arg("snapshot_at") = std::vector<int>{}, py::arg("snapshots") = py::none())
      .def("restore", &Engine::restore, py::arg("snapshot"), py::call_guard<py::gil_scoped_release>())
      .def("decode_begin",
           [](Engine& e, int max_tokens, float temperature, int top_k, float top_p, float min_p,
              float presence_penalty, float frequency_penalty, float repetition_penalty, uint64_t seed,
              int logprobs) {
             e.decode_begin(max_tokens, sampling(temperature, top_k, top_p, min_p, presence_penalty,
                                                 frequency_penalty, repetition_penalty, seed, logprobs));
           },
           py::arg("max_tokens"), MQ_SAMPLING_ARGS)
      .def_property_readonly("has_mtp", &Engine::has_mtp)
      .def(
          "mtp_logits",
          [](Engine& e, std::vector<uint32_t> ids) {
            std::vector<float> out;
            {
              py::gil_scoped_release release;
              out = e.mtp_logits(ids);
            }
            const size_t vocab = size_t(e.dims().vocab);
            py::array_t<float> a({out.size() / vocab, vocab});
            std::copy(out.begin(), out.end(), a.mutable_data());
            return a;
          },
          py::arg("ids"))
      .def("decode_next", &Engine::decode_next, py::call_guard<py::gil_scoped_release>())
      .def("decode_end", &Engine::decode_end, py::call_guard<py::gil_scoped_release>())
      .def(
          "verify",
          [](Engine& e, std::vector<uint32_t> drafts, float temperature, int top_k, float top_p, float min_p,
             uint64_t seed) {
            py::gil_scoped_release release;
            return e.verify(drafts, sampling(temperature, top_k, top_p, min_p, 0.0f, 0.0f, 1.0f, seed, -1));
          },
          py::arg("drafts"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
          py::arg("min_p") = 0.0f, py::arg("seed") = 0)
      .def(
          "verify_mtp",
          [](Engine& e, uint32_t drafts, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
            py::gil_scoped_release release;
            return e.verify_mtp(drafts, sampling(temperature, top_k, top_p, min_p, 0.0f, 0.0f, 1.0f, seed, -1));
          },
          py::arg("drafts"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
          py::arg("min_p") = 0.0f, py::arg("seed") = 0)
      .def(
          "step",
          // entries: [(slot, drafts, sampling)], sampling a dict of the Sampling keyword arguments.
          [](Engine& e, const std::vector<std::tuple<int, std::vector<uint32_t>, py::dict>>& entries) {
            std::vector<Engine::SlotStep> steps;
            static const std::set<std::string> known{"temperature",       "top_k",           "top_p",
                                                     "min_p",             "presence_penalty", "frequency_penalty",
                                                     "repetition_penalty", "seed",           "logprobs"};
            for (const auto& [slot, drafts, kw] : entries) {
              for (const auto& item : kw)
                if (!known.count(item.first.cast<std::string>()))
                  throw py::value_error("step: unknown sampling keyword '" + item.first.cast<std::string>() + "'");
              auto get = [&kw](const char* key, auto neutral) {
                return kw.contains(key) ? kw[key].cast<decltype(neutral)>() : neutral;
              };
              steps.push_back({slot, drafts,
                               sampling(get("temperature", 0.0f), get("top_k", 0), get("top_p", 1.0f),
                                        get("min_p", 0.0f), get("presence_penalty", 0.0f),
                                        get("frequency_penalty", 0.0f), get("repetition_penalty", 1.0f),
                                        get("seed", uint64_t(0)), get("logprobs", -1))});
            }
            py::gil_scoped_release release;
            return e.step(steps);
          },
          py::arg("entries"))
      .def("chosen", &Engine::chosen)
      // (logprob, [(id, logprob), ...]) of the token decode_next returned last, or None.
      .def("last_logprobs",
           [](const Engine& e) -> py::object {
             const auto found = e.last_logprobs();
             if (!found) return py::none();
             return py::make_tuple(found->logprob, found->top);
           })
      .def("counters", [](const Engine& e) {
        const Counters& c = e.counters();
        py::dict d;
        d["steps"] = c.steps;
        d["command_buffers"] = c.command_buffers;
        d["failed_steps"] = c.failed_steps;
        d["dispatches"] = c.dispatches;
        d["dispatches_last_step"] = c.last_step_dispatches;
        d["barriers"] = c.barriers;
        d["barriers_last_step"] = c.last_step_barriers;
        d["host_encode_us"] = c.host_encode_us;
        d["host_encode_us_last_step"] = c.last_step_host_encode_us;
        d["cpu_waits"] = c.cpu_waits;
        d["tokens_decoded"] = c.tokens_decoded;
        d["max_steps_in_flight"] = c.max_steps_in_flight;
        d["weight_bytes_per_token"] = c.weight_bytes_per_token;
        d["weight_bytes_copied"] = c.weight_bytes_copied;
        d["weight_buffers"] = c.weight_buffers;
        d["load_rss_before"] = c.load_rss_before;
        d["load_peak_rss"] = c.load_peak_rss;
        d["memory_estimate"] = c.memory_estimate;
        d["library_kernels"] = c.library_kernels;
        d["library_source_bytes"] = c.library_source_bytes;
        d["verify_steps"] = c.verify_steps;
        d["drafted"] = c.drafted;
        d["accepted"] = c.accepted;
        d["drafted_at"] = c.drafted_at;
        d["accepted_at"] = c.accepted_at;
        return d;
      });
}
