// metalqwen_bench: every kernel of a decode step, and the whole step, at the real shapes of
// the Qwen3.5 family, on synthetic (zero) weights. See bench/README.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cost_model.h"
#include "engine/engine.h"
#include "report.h"
#include "shapes.h"
#include "synthetic_model.h"

namespace mq::bench {
namespace {

struct Options {
  std::string device;  // "" = the best available
  std::vector<std::string> shapes = {"0.8B", "9B", "27B", "35B-A3B"};
  std::string filter;  // regex over "<shape>/<kernel> <sizes>" and "<shape>/decode_step"
  bool json = false, quick = false;
  int repeats = 7, dispatches = 50, tokens = 32, context = 1;
  double peak_gbs = 0;  // overrides the chip table
};

const char* kUsage =
    "usage: metalqwen_bench [--device metal|cpu] [--shape NAME[,NAME...]] [--filter REGEX] [--json]\n"
    "                       [--quick] [--repeats N] [--dispatches N] [--tokens N] [--context N] [--peak-gbs GB/S]\n"
    "shapes: 0.8B 9B 27B 35B-A3B (default: all four), tiny (test size)\n";

int positive(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  if (used != value.size() || n < 1)
    throw std::invalid_argument(flag + " needs a positive integer, got '" + value + "'");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  bool repeats = false, dispatches = false, tokens = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device") {
      o.device = value();
      if (o.device != "metal" && o.device != "cpu") throw std::invalid_argument("--device is metal or cpu");
    } else if (a == "--shape") {
      o.shapes.clear();
      std::stringstream list(value());
      for (std::string s; std::getline(list, s, ',');) o.shapes.push_back(s);
    } else if (a == "--filter") {
      o.filter = value();
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--repeats") {
      o.repeats = positive(a, value()), repeats = true;
    } else if (a == "--dispatches") {
      o.dispatches = positive(a, value()), dispatches = true;
    } else if (a == "--tokens") {
      o.tokens = positive(a, value()), tokens = true;
    } else if (a == "--context") {
      o.context = positive(a, value());
    } else if (a == "--peak-gbs") {
      o.peak_gbs = std::stod(value());
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown option " + a);
    }
  }
  if (o.quick) {  // tiny repeat counts: checks the harness, not the speed
    if (!repeats) o.repeats = 2;
    if (!dispatches) o.dispatches = 2;
    if (!tokens) o.tokens = 2;
  }
  return o;
}

// Runs `d` n times in one command buffer, a barrier between each (dependent like a step's
// dispatches): the device's seconds for all of them.
double time_dispatch(gpu::Device& device, engine::Kernels& kernels, const engine::RecordedDispatch& d, int n) {
  auto cb = device.new_command_buffer();
  const auto& kernel = kernels.get(d.kernel).kernel;
  for (int i = 0; i < n; ++i) {
    if (i > 0) cb->barrier();
    cb->set_kernel(kernel);
    for (uint32_t index = 0; index < d.args.size(); ++index) {
      const auto& a = d.args[index];
      if (!a.bytes.empty()) cb->set_bytes(index, a.bytes.data(), a.bytes.size());
      else if (a.buffer) cb->set_buffer(index, a.buffer, a.offset);
    }
    if (d.grid_of_threads) cb->dispatch_threads(d.grid, d.threads);
    else cb->dispatch_threadgroups(d.grid, d.threads);
  }
  cb->commit();
  cb->wait();
  return cb->gpu_seconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The same dispatch (kernel, parameters, grid) however many times a step encodes it.
std::string dispatch_key(const engine::RecordedDispatch& d) {
  std::string key = d.kernel + "|" + std::to_string(d.grid.x) + "," + std::to_string(d.grid.y) + "," +
                    std::to_string(d.grid.z) + "|" + std::to_string(d.threads.x);
  for (const auto& a : d.args) key.append(a.bytes.begin(), a.bytes.end());
  return key;
}

ShapeResult run_shape(const std::shared_ptr<gpu::Device>& device, const BenchShape& shape, const Options& o,
                      const std::regex* filter) {
  ShapeResult r;
  r.shape = shape.name;
  r.note = shape.note;
  r.context = o.context;
  auto wanted = [&](const std::string& name) { return !filter || std::regex_search(shape.name + "/" + name, *filter); };
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("metalqwen-bench-" + std::to_string(getpid()) + "-" + shape.name))
                               .string();
  engine::EngineOptions options;
  options.max_context = o.context + o.tokens + 8;
  std::unique_ptr<engine::Engine> engine;
  try {
    engine = std::make_unique<engine::Engine>(device, synthetic_model(shape.dims, path), options);
  } catch (const std::exception& e) {
    std::remove(path.c_str());
    r.error = e.what();
    return r;
  }
  std::remove(path.c_str());  // the mapping keeps the (sparse) data

  // `context` positions in the cache, then one recorded decode step (the warm-up).
  const engine::Sampling greedy;
  engine->prefill(0, std::vector<uint32_t>(size_t(o.context), 0u), greedy, false, false);
  std::vector<engine::RecordedDispatch> step;
  engine->kernels().record_into(&step);
  engine->decode_begin(0, 2, greedy);
  while (engine->decode_next()) {
  }
  engine->decode_end();
  engine->kernels().record_into(nullptr);

  // Each distinct dispatch of the step, timed alone.
  std::map<std::string, size_t> index;
  std::vector<const engine::RecordedDispatch*> first;
  double step_bytes = 0;
  for (const auto& d : step) {
    const DispatchCost cost = dispatch_cost(d);
    step_bytes += cost.bytes;
    const std::string key = dispatch_key(d);
    auto [it, added] = index.emplace(key, r.kernels.size());
    if (added) {
      r.kernels.push_back({d.kernel, cost.shape, 0, 0, cost.bytes, cost.flops});
      first.push_back(&d);
    }
    r.kernels[it->second].per_step += 1;
  }
  std::vector<KernelResult> kept;
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    KernelResult k = r.kernels[i];
    if (!wanted(k.kernel + " " + k.sizes)) continue;
    std::vector<double> seconds;
    for (int rep = 0; rep < o.repeats; ++rep)
      seconds.push_back(time_dispatch(*device, engine->kernels(), *first[i], o.dispatches));
    k.us_per_dispatch = median(seconds) / o.dispatches * 1e6;
    kept.push_back(k);
  }
  r.kernels = std::move(kept);

  if (wanted("decode_step")) {
    // Steps committed back to back as generation commits them (step t+1 before t is waited for).
    engine->reset(0);
    engine->prefill(0, std::vector<uint32_t>(size_t(o.context), 0u), greedy, false, false);
    const auto start = std::chrono::steady_clock::now();
    engine->decode_begin(0, o.tokens + 1, greedy);
    while (engine->decode_next()) {
    }
    engine->decode_end();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    const engine::Counters& c = engine->counters();
    r.step = StepResult{took.count() / o.tokens, step_bytes,           c.weight_bytes_per_token,
                        c.last_step_dispatches,  c.last_step_barriers, c.last_step_host_encode_us};
  }
  return r;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::optional<std::regex> filter;
  try {
    if (!o.filter.empty()) filter.emplace(o.filter);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument("--filter '" + o.filter + "' is not a regular expression: " + e.what());
  }
  auto device = gpu::open_device(o.device);
  Report report;
  report.device_kind = device->kind();
  report.device_name = device->name();
  report.chip = gpu::apple_chip(device->name());
  report.peak_gbs = o.peak_gbs > 0 ? o.peak_gbs : report.chip.gb_s;
  report.quick = o.quick;
  report.repeats = o.repeats;
  report.dispatches = o.dispatches;
  report.tokens = o.tokens;
  const std::vector<BenchShape> shapes = bench_shapes();
  for (const std::string& name : o.shapes) {
    auto it = std::find_if(shapes.begin(), shapes.end(), [&](const BenchShape& s) { return s.name == name; });
    if (it == shapes.end()) throw std::invalid_argument("unknown shape '" + name + "'");
    if (!o.json) std::cerr << "metalqwen_bench: " << name << "\n";
    report.shapes.push_back(run_shape(device, *it, o, filter ? &*filter : nullptr));
  }
  if (o.json) print_json(report, std::cout);
  else print_table(report, std::cout);
  return 0;
}

}  // namespace
}  // namespace mq::bench

int main(int argc, char** argv) {
  try {
    return mq::bench::run(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "metalqwen_bench: " << e.what() << "\n" << mq::bench::kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "metalqwen_bench: " << e.what() << "\n";
    return 1;
  }
}
