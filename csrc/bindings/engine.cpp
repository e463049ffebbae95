// metalqwen._core.Engine: converts the Python checkpoint description to the
// engine's plain structs and forwards calls; numpy in and out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>

#include "engine/engine.h"
#include "engine/layer_tensors.h"
#include "tensor_descs.h"

namespace py = pybind11;
using namespace mq::engine;

std::map<std::string, TensorDesc> to_tensor_descs(const py::dict& tensors) {
  std::map<std::string, TensorDesc> out;
  for (const auto& [name, entry] : tensors) {
    auto e = entry.cast<py::tuple>();
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
    out[name.cast<std::string>()] = std::move(t);
  }
  return out;
}

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
  if (dims.contains("mrope_section")) {
    const auto section = dims["mrope_section"].cast<std::vector<int>>();
    if (section.size() != 3) throw std::runtime_error("[engine] mrope_section must have 3 entries");
    for (int i = 0; i < 3; ++i) d.mrope_section[i] = section[size_t(i)];
  }
  for (const auto& kind : field<std::vector<std::string>>(dims, "layer_types"))
    d.full_attention.push_back(kind == "full_attention");
  if (int(d.full_attention.size()) != d.layers)
    throw std::runtime_error("[engine] layer_types does not match num_hidden_layers");
  m.tensors = to_tensor_descs(tensors);
  return m;
}

// A DFlash drafter's {"dims", "tensors"} (dflash_checkpoint.Drafter.describe) into the description.
void add_drafter(ModelDesc& m, const py::dict& draft) {
  const py::dict dims = field<py::dict>(draft, "dims");
  DrafterDims& d = m.drafter;
  d.hidden = field<int>(dims, "hidden_size");
  d.layers = field<int>(dims, "num_hidden_layers");
  d.heads = field<int>(dims, "num_attention_heads");
  d.kv_heads = field<int>(dims, "num_key_value_heads");
  d.head_dim = field<int>(dims, "head_dim");
  d.intermediate = field<int>(dims, "intermediate_size");
  d.block_size = field<int>(dims, "block_size");
  d.mask_token_id = field<int>(dims, "mask_token_id");
  d.eps = field<float>(dims, "rms_norm_eps");
  d.rope_theta = field<float>(dims, "rope_theta");
  d.target_layer_ids = field<std::vector<int>>(dims, "target_layer_ids");
  for (auto& [name, t] : to_tensor_descs(field<py::dict>(draft, "tensors"))) m.tensors["dflash." + name] = std::move(t);
}

// Sampling's fields, in declaration order: the keyword constructor takes these names, repr shows them.
const char* const kSamplingFields[] = {
    "temperature",        "top_k", "top_p",    "min_p",      "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed",  "logprobs", "logit_bias", "token_mask"};

py::array_t<float> logits_array(const std::vector<float>& out, size_t vocab) {
  py::array_t<float> a({out.size() / vocab, vocab});
  std::copy(out.begin(), out.end(), a.mutable_data());
  return a;
}

// A step's entries: (slot, drafts, Sampling) or (slot, drafts, Sampling, MTP drafts).
std::vector<Engine::SlotStep> slot_steps(const py::list& entries) {
  std::vector<Engine::SlotStep> steps;
  for (const py::handle& entry : entries) {
    const auto t = entry.cast<py::tuple>();
    if (t.size() != 3 && t.size() != 4)
      throw py::value_error("a step entry is (slot, drafts, Sampling) or (slot, drafts, Sampling, mtp_drafts), got " +
                            std::to_string(t.size()) + " fields");
    steps.push_back({.slot = t[0].cast<int>(),
                     .drafts = t[1].cast<std::vector<uint32_t>>(),
                     .sampling = t[2].cast<Sampling>(),
                     .mtp_drafts = t.size() == 4 ? t[3].cast<uint32_t>() : 0});
  }
  return steps;
}

// A prompt's image features as Python gives them: (first prompt row, rows, Buffer f32 [rows][hidden]).
using ImageFeatures = std::vector<std::tuple<uint32_t, uint32_t, std::shared_ptr<mq::gpu::Buffer>>>;

// The PromptImages of prefill's / a prompt chunk's rope_positions (None: no images) and features.
std::optional<PromptImages> prompt_images(const char* where, const py::object& rope_positions,
                                          const ImageFeatures& features) {
  if (rope_positions.is_none()) {
    if (!features.empty()) throw py::value_error(std::string(where) + ": image features need rope_positions");
    return std::nullopt;
  }
  auto pos = rope_positions.cast<py::array_t<int32_t, py::array::c_style | py::array::forcecast>>();
  PromptImages images;
  images.rope_positions.assign(pos.data(), pos.data() + pos.size());
  for (auto& [first, rows, buffer] : features) images.features.push_back({first, rows, buffer, 0});
  return images;
}

}  // namespace

void bind_engine(py::module_& m) {
  // What an engine of these options would need (memory_budget.h), without loading it: each rank of
  // a pipeline checks every rank's layer range against that rank's memory before any loads.
  m.def(
      "estimate_memory",
      [](py::dict dims, py::dict tensors, int max_context, int kv_bits, int prefill_chunk, int max_sequences,
         int first_layer, int end_layer, int max_draft, bool mtp) {
        const EngineOptions options{.max_context = max_context,
                                    .kv_bits = kv_bits,
                                    .prefill_chunk = prefill_chunk,
                                    .max_draft = max_draft,
                                    .mtp = mtp,
                                    .max_sequences = max_sequences,
                                    .first_layer = first_layer,
                                    .end_layer = end_layer};
        const MemoryNeeds needs = estimate_memory(keep_layer_range(to_model_desc(dims, tensors), options), options);
        py::dict out;
        out["weights"] = needs.weights;
        out["kv_cache"] = needs.kv_cache;
        out["workspace"] = needs.workspace;
        out["total"] = needs.total();
        return out;
      },
      py::arg("dims"), py::arg("tensors"), py::arg("max_context"), py::arg("kv_bits"), py::arg("prefill_chunk"),
      py::arg("max_sequences") = 1, py::arg("first_layer") = 0, py::arg("end_layer") = -1, py::arg("max_draft") = 0,
      py::arg("mtp") = false);
  // Device memory holding a sequence state (see engine.h); Engine.restore puts it back.
  py::class_<Snapshot, std::shared_ptr<Snapshot>>(m, "Snapshot")
      .def_readonly("position", &Snapshot::position)
      .def_readonly("rope_delta", &Snapshot::rope_delta)
      .def_readonly("tokens", &Snapshot::tokens)
      .def_property_readonly("nbytes", &Snapshot::nbytes)
      // Its state bytes (a Buffer: memoryview(snapshot.data) reads them), for the disk cache.
      .def_readonly("data", &Snapshot::data);
  // How the next token is chosen (engine.h): one object for prefill, decode_begin, verify,
  // verify_mtp and step; keyword arguments only, neutral by default.
  py::class_<Sampling>(m, "Sampling")
      .def(py::init([](const py::kwargs& kw) {
        py::object s = py::cast(Sampling{});
        for (const auto& [key, value] : kw) {
          const std::string name = key.cast<std::string>();
          if (std::find_if(std::begin(kSamplingFields), std::end(kSamplingFields),
                           [&](const char* f) { return name == f; }) == std::end(kSamplingFields))
            throw py::value_error("unknown sampling keyword '" + name + "'");
          s.attr(name.c_str()) = value;
        }
        return s.cast<Sampling>();
      }))
      .def_readwrite("temperature", &Sampling::temperature)
      .def_readwrite("top_k", &Sampling::top_k)
      .def_readwrite("top_p", &Sampling::top_p)
      .def_readwrite("min_p", &Sampling::min_p)
      .def_readwrite("presence_penalty", &Sampling::presence_penalty)
      .def_readwrite("frequency_penalty", &Sampling::frequency_penalty)
      .def_readwrite("repetition_penalty", &Sampling::repetition_penalty)
      .def_readwrite("seed", &Sampling::seed)
      .def_readwrite("logprobs", &Sampling::logprobs)
      .def_readwrite("logit_bias", &Sampling::logit_bias)  // [(token id, bias)]
      .def_readwrite("token_mask", &Sampling::token_mask)
      .def_property_readonly("penalised", &Sampling::penalised)
      .def("__repr__", [](const py::object& self) {
        std::string text = "Sampling(";
        for (const char* f : kSamplingFields)
          text += std::string(f == kSamplingFields[0] ? "" : ", ") + f + "=" +
                  py::repr(self.attr(f)).cast<std::string>();
        return text + ")";
      });
  py::class_<Engine>(m, "Engine")
      .def(py::init([](std::shared_ptr<mq::gpu::Device> device, py::dict dims, py::dict tensors, int max_context,
                       int kv_bits, int prefill_chunk, int max_draft, py::object progress, bool mtp,
                       const std::string& mtp_hidden, int max_sequences, int prefill_layers_per_buffer, int first_layer,
                       int end_layer, const py::dict& beside, py::object draft) {
             if (mtp_hidden != "post_norm" && mtp_hidden != "pre_norm")
               throw py::value_error("mtp_hidden must be 'post_norm' or 'pre_norm'");
             ModelDesc desc = to_model_desc(dims, tensors);
             uint64_t beside_bytes = 0;
             for (const auto& entry : to_tensor_descs(beside)) beside_bytes += placed_bytes(entry.second);
             if (!draft.is_none()) add_drafter(desc, draft.cast<py::dict>());
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
             const EngineOptions options{
                 .max_context = max_context,
                 .kv_bits = kv_bits,
                 .prefill_chunk = prefill_chunk,
                 .max_draft = max_draft,
                 .mtp = mtp,
                 .mtp_hidden = mtp_hidden == "pre_norm" ? MtpHidden::pre_norm : MtpHidden::post_norm,
                 .max_sequences = max_sequences,
                 .prefill_layers_per_buffer = prefill_layers_per_buffer,
                 .first_layer = first_layer,
                 .end_layer = end_layer,
                 .beside_weight_bytes = beside_bytes};
             return std::make_unique<Engine>(std::move(device), std::move(desc), options, report);
           }),
           py::arg("device"), py::arg("dims"), py::arg("tensors"), py::arg("max_context"), py::arg("kv_bits"),
           py::arg("prefill_chunk"), py::arg("max_draft") = 0, py::arg("progress") = py::none(), py::arg("mtp") = false,
           py::arg("mtp_hidden") = "post_norm", py::arg("max_sequences") = 1,
           py::arg("prefill_layers_per_buffer") = EngineOptions{}.prefill_layers_per_buffer, py::arg("first_layer") = 0,
           py::arg("end_layer") = -1, py::arg("beside") = py::dict(), py::arg("draft") = py::none())
      .def_property_readonly("max_sequences", &Engine::max_sequences)
      .def_property_readonly("max_context", &Engine::max_context)
      .def_property_readonly("max_rows", &Engine::max_rows)  // rows of one prefill chunk (prefill_chunk)
      .def_property_readonly("max_step_rows", &Engine::max_step_rows)  // rows of a verify or shared step
      .def("reset", &Engine::reset, py::arg("slot"))
      .def("position", &Engine::position, py::arg("slot"))
      .def("tokens", &Engine::tokens, py::arg("slot"))
      .def("chosen", &Engine::chosen, py::arg("slot"))
      .def(
          "prefill",
          [](Engine& e, int slot, std::vector<uint32_t> tokens, const Sampling& sampling, const std::string& logits,
             py::object progress, std::vector<int> snapshot_at, py::object snapshots, py::object rope_positions,
             const ImageFeatures& features, std::optional<uint32_t> next_token) -> py::object {
            if (logits != "none" && logits != "last" && logits != "all")
              throw py::value_error("logits must be 'none', 'last' or 'all'");
            // Between chunks: a pending Ctrl-C raises KeyboardInterrupt here (the chunks
            // submitted stay fed), then progress(done, total) if given.
            const PrefillProgress between_chunks = [&progress](size_t done, size_t total) {
              py::gil_scoped_acquire acquire;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (!progress.is_none()) progress(done, total);
            };
            const std::optional<PromptImages> images = prompt_images("prefill", rope_positions, features);
            std::vector<float> out;
            std::vector<std::shared_ptr<Snapshot>> taken;
            {
              py::gil_scoped_release release;
              out = e.prefill(slot, tokens, sampling, logits == "all", logits == "last", between_chunks, snapshot_at,
                              &taken, images ? &*images : nullptr, next_token);
            }
            if (!snapshots.is_none())
              for (auto& s : taken) snapshots.attr("append")(s);
            if (logits == "none") return py::none();
            return logits_array(out, size_t(e.dims().vocab));
          },
          py::arg("slot"), py::arg("tokens"), py::arg("sampling") = Sampling{}, py::arg("logits") = "none",
          py::arg("progress") = py::none(), py::arg("snapshot_at") = std::vector<int>{},
          py::arg("snapshots") = py::none(), py::arg("rope_positions") = py::none(),
          py::arg("features") = ImageFeatures{}, py::arg("next_token") = py::none(),
          "rope_positions: int32 [prompt rows][3] (time, height, width) of a prompt with images, from the slot's "
          "row 0 (tokens are its rows from position(); the slot's rope_delta follows from them); features: (first "
          "prompt row, rows, Buffer of f32 [rows][hidden]) replacing those embeddings; next_token: the prompt's "
          "token after these, fed by a later call (nothing is chosen)")
      .def("rope_delta", &Engine::rope_delta, py::arg("slot"))
      .def("restore", &Engine::restore, py::arg("slot"), py::arg("snapshot"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("snapshot_layout", &Engine::snapshot_layout)  // [(bytes, bytes per row)] per region
      .def(
          "import_snapshot",
          [](Engine& e, int position, int rope_delta, const std::vector<uint32_t>& tokens, const py::buffer& data) {
            Py_buffer view;  // any C-contiguous buffer (bytes, a memoryview slice of a file's bytes)
            if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
            std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> held(&view, PyBuffer_Release);
            py::gil_scoped_release release;
            return e.import_snapshot(position, rope_delta, tokens, view.buf, size_t(view.len));
          },
          py::arg("position"), py::arg("rope_delta"), py::arg("tokens"), py::arg("data"))
      .def("decode_begin", &Engine::decode_begin, py::arg("slot"), py::arg("max_tokens"),
           py::arg("sampling") = Sampling{})
      .def("decode_next", &Engine::decode_next, py::call_guard<py::gil_scoped_release>())
      .def("decode_end", &Engine::decode_end, py::call_guard<py::gil_scoped_release>())
      // (logprob, [(id, logprob), ...]) of the token decode_next (or step) returned last for the slot, or None.
      .def(
          "last_logprobs",
          [](const Engine& e, int slot) -> py::object {
            const auto found = e.last_logprobs(slot);
            if (!found) return py::none();
            return py::make_tuple(found->logprob, found->top);
          },
          py::arg("slot"))
      .def("verify", &Engine::verify, py::arg("slot"), py::arg("drafts"), py::arg("sampling") = Sampling{},
           py::call_guard<py::gil_scoped_release>())
      .def("verify_mtp", &Engine::verify_mtp, py::arg("slot"), py::arg("drafts"), py::arg("sampling") = Sampling{},
           py::call_guard<py::gil_scoped_release>())
      .def("verify_rows", &Engine::verify_rows, py::arg("slot"), py::arg("drafts"),
           py::call_guard<py::gil_scoped_release>())
      .def("verify_accept", &Engine::verify_accept, py::arg("slot"), py::arg("drafts"), py::arg("accepted"),
           py::arg("next"), py::call_guard<py::gil_scoped_release>())
      .def("mtp_drafts", &Engine::mtp_drafts, py::arg("slot"), py::arg("drafts"),
           py::call_guard<py::gil_scoped_release>())
      .def("verify_dflash", &Engine::verify_dflash, py::arg("slot"), py::arg("drafts"),
           py::arg("sampling") = Sampling{}, py::call_guard<py::gil_scoped_release>())
      .def(
          "step",
          // entries: [(slot, drafts, Sampling[, mtp_drafts])]; before_choice(): called (GIL held) while the GPU runs
          // the forward pass of a step with masked slots, to write their token_masks rows. prompt: a joining
          // prompt's chunk (slot, token ids, Sampling, last, snapshot[, rope_positions, features] as prefill's)
          // whose rows join the step (Engine::PromptChunk;
          // one more result entry after the slots'); snapshots: a list the chunk's snapshot is appended to.
          [](Engine& e, const py::list& entries, py::object before_choice, py::object prompt, py::object snapshots) {
            const std::vector<Engine::SlotStep> steps = slot_steps(entries);
            Engine::BeforeChoice hook;
            if (!before_choice.is_none())
              hook = [&before_choice]() {
                py::gil_scoped_acquire acquire;
                before_choice();
              };
            std::optional<Engine::PromptChunk> chunk;
            std::optional<PromptImages> images;
            if (!prompt.is_none()) {
              const auto t = prompt.cast<py::tuple>();
              if (t.size() != 5 && t.size() != 7)
                throw py::value_error(
                    "a prompt chunk is (slot, token ids, Sampling, last, snapshot[, rope_positions, "
                    "features]), got " +
                    std::to_string(t.size()) + " fields");
              if (t.size() == 7) images = prompt_images("step", t[5], t[6].cast<ImageFeatures>());
              chunk = Engine::PromptChunk{.slot = t[0].cast<int>(),
                                          .tokens = t[1].cast<std::vector<uint32_t>>(),
                                          .sampling = t[2].cast<Sampling>(),
                                          .last = t[3].cast<bool>(),
                                          .snapshot = t[4].cast<bool>(),
                                          .images = images ? &*images : nullptr};
            }
            std::vector<std::vector<uint32_t>> out;
            std::vector<std::shared_ptr<Snapshot>> taken;
            {
              py::gil_scoped_release release;
              out = e.step(steps, hook, chunk ? &*chunk : nullptr, &taken);
            }
            if (!snapshots.is_none())
              for (auto& s : taken) snapshots.attr("append")(s);
            return out;
          },
          py::arg("entries"), py::arg("before_choice") = py::none(), py::arg("prompt") = py::none(),
          py::arg("snapshots") = py::none())
      // step = step_commit + step_wait: entries as step's (no drafts or token masks while steps
      // are in flight); step_wait returns the oldest committed step's tokens per entry.
      .def(
          "step_commit",
          [](Engine& e, const py::list& entries) {
            const std::vector<Engine::SlotStep> steps = slot_steps(entries);
            py::gil_scoped_release release;
            e.step_commit(steps);
          },
          py::arg("entries"))
      .def("step_wait", &Engine::step_wait, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("steps_in_flight", &Engine::steps_in_flight)
      // The grammar masks the choices of Sampling(token_mask=True) read: a writable uint32 view
      // [max_sequences][mask_words] of the engine's shared buffer (row s: slot s).
      .def("token_masks",
           [](py::object self) {
             const Engine& e = self.cast<const Engine&>();
             const auto rows = size_t(e.max_sequences()), words = size_t(e.mask_words());
             return py::array_t<uint32_t>({rows, words}, {words * 4, size_t(4)}, e.token_masks(), self);
           })
      // Pipeline parallelism: the layer range [first, end) and what it holds.
      .def_property_readonly("layers", [](const Engine& e) { return std::make_pair(e.layers().first, e.layers().end); })
      .def_property_readonly("embeds", &Engine::embeds)
      .def_property_readonly("has_head", &Engine::has_head)
      // The residual stream between steps: a writable float32 view [max_rows][hidden] of the buffer
      // the next step reads (engines that do not embed) or the last one left (engines without the
      // head). Take a fresh view around each step: the buffer behind it alternates.
      .def("residual_rows",
           [](py::object self) {
             const Engine& e = self.cast<const Engine&>();
             const auto rows = size_t(e.max_rows()), hidden = size_t(e.dims().hidden);
             return py::array_t<float>({rows, hidden}, {hidden * 4, size_t(4)}, e.residual_rows(), self);
           })
      .def("set_chosen", &Engine::set_chosen, py::arg("slot"), py::arg("token"))
      // A shared step's rows on an engine of a layer range (Engine::step_rows): a writable float32
      // view [max_step_rows + max_rows][hidden] (rows 0 with max_sequences 1 or the whole model).
      .def("step_rows",
           [](py::object self) {
             const Engine& e = self.cast<const Engine&>();
             const auto rows = size_t(e.step_rows_count()), hidden = size_t(e.dims().hidden);
             return py::array_t<float>({rows, hidden}, {hidden * 4, size_t(4)}, e.step_rows(), self);
           })
      // outcomes: [(slot, accepted, next)] per entry of the last step; prompt_token: the first token
      // after its last prompt chunk (Engine::step_accept).
      .def(
          "step_accept",
          [](Engine& e, const std::vector<std::tuple<int, uint32_t, uint32_t>>& outcomes,
             std::optional<uint32_t> prompt_token) {
            std::vector<Engine::SlotOutcome> out;
            for (const auto& [slot, accepted, next] : outcomes)
              out.push_back({.slot = slot, .accepted = accepted, .next = next});
            py::gil_scoped_release release;
            e.step_accept(out, prompt_token);
          },
          py::arg("outcomes"), py::arg("prompt_token") = py::none())
      .def_property_readonly("has_mtp", &Engine::has_mtp)
      .def("mtp_ready", &Engine::mtp_ready, py::arg("slot"))
      .def(
          "mtp_logits",
          [](Engine& e, int slot, std::vector<uint32_t> ids) {
            std::vector<float> out;
            {
              py::gil_scoped_release release;
              out = e.mtp_logits(slot, ids);
            }
            return logits_array(out, size_t(e.dims().vocab));
          },
          py::arg("slot"), py::arg("ids"))
      .def_property_readonly("has_dflash", &Engine::has_dflash)
      .def(
          "dflash_hidden",
          [](const Engine& e, uint32_t rows) {
            const std::vector<float> h = e.dflash_hidden(rows);
            return logits_array(h, rows ? h.size() / rows : 1);
          },
          py::arg("rows"))
      .def(
          "dflash_block",
          [](Engine& e, int slot, uint32_t k) {
            std::vector<float> out;
            {
              py::gil_scoped_release release;
              out = e.dflash_block(slot, k);
            }
            return logits_array(out, size_t(e.dims().vocab));
          },
          py::arg("slot"), py::arg("k"))
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
        d["pipelined_steps"] = c.pipelined_steps;
        d["weight_bytes_per_token"] = c.weight_bytes_per_token;
        d["weight_bytes_copied"] = c.weight_bytes_copied;
        d["weight_buffers"] = c.weight_buffers;
        d["load_rss_before"] = c.load_rss_before;
        d["load_peak_rss"] = c.load_peak_rss;
        d["memory_estimate"] = c.memory_estimate;
        d["weight_bytes"] = c.weight_bytes;
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
