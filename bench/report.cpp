#include "report.h"

#include <cmath>
#include <cstdio>

namespace mq::bench {
namespace {

const char* kCpuNote = "the CPU runtime is a test backend: these figures time it, they say nothing about an Apple GPU";

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

// GB/s of `bytes` in `us` microseconds.
double gb_s(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0; }

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", unsigned(c));
      q += escaped;
      continue;
    }
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// A JSON number, or null for "not known here".
std::string number(double v, bool known = true) {
  if (!known || !std::isfinite(v)) return "null";
  return format("%.10g", v);
}

}  // namespace

void print_table(const Report& r, std::ostream& out) {
  out << "metalqwen_bench on " << r.device_name << " (" << r.device_kind << ")";
  if (r.peak_gbs > 0)
    out << ", peak " << format("%.0f", r.peak_gbs) << " GB/s" << (r.chip.chip.empty() ? "" : " (" + r.chip.chip + ")");
  else out << ", peak bandwidth unknown (no % of peak; pass --peak-gbs)";
  out << "\n";
  if (!r.chip.note.empty()) out << "note: " << r.chip.note << "\n";
  if (r.device_kind == "cpu") out << "NOTE: " << kCpuNote << "\n";
  if (r.quick) out << "NOTE: --quick: tiny repeat counts, the figures are noise\n";
  for (const ShapeResult& s : r.shapes) {
    out << "\n== " << s.shape << ": " << s.note << "\n";
    if (!s.error.empty()) {
      out << "   skipped: " << s.error << "\n";
      continue;
    }
    if (s.kernels.empty() && !s.step) out << "   (nothing matches --filter)\n";
    if (!s.kernels.empty()) {
      char line[256];
      std::snprintf(line, sizeof line, "%-34s %-22s %5s %10s %10s %10s %9s %6s %9s\n", "kernel", "sizes", "/step",
                    "us/disp", "us/step", "MB/disp", "GB/s", "%peak", "GFLOP/s");
      out << line;
      for (const KernelResult& k : s.kernels) {
        const double bw = gb_s(k.bytes, k.us_per_dispatch);
        std::snprintf(line, sizeof line, "%-34s %-22s %5d %10.2f %10.1f %10.3f %9s %6s %9.1f\n", k.kernel.c_str(),
                      k.sizes.c_str(), k.per_step, k.us_per_dispatch, k.us_per_dispatch * k.per_step, k.bytes / 1e6,
                      k.bytes > 0 ? format("%.1f", bw).c_str() : "-",
                      k.bytes > 0 && r.peak_gbs > 0 ? format("%.0f", 100 * bw / r.peak_gbs).c_str() : "-",
                      k.us_per_dispatch > 0 ? k.flops / k.us_per_dispatch / 1e3 : 0.0);
        out << line;
      }
    }
    if (s.step) {
      const StepResult& t = *s.step;
      out << "decode step at context " << s.context << ": " << format("%.1f", t.us_per_token) << " us/token ("
          << format("%.1f", 1e6 / t.us_per_token) << " tok/s), " << format("%.1f", t.bytes_per_token / 1e6)
          << " MB/token (" << format("%.1f", t.weight_bytes_per_token / 1e6) << " MB of weights), " << t.dispatches
          << " dispatches, " << t.barriers << " barriers, host encode " << format("%.0f", t.host_encode_us) << " us\n";
      if (r.peak_gbs > 0) {
        const double limit_us = t.bytes_per_token / (r.peak_gbs * 1e3);
        out << "physical limit " << format("%.1f", limit_us) << " us/token at " << format("%.0f", r.peak_gbs)
            << " GB/s: the step reaches " << format("%.1f", 100 * limit_us / t.us_per_token) << " % of it\n";
      }
    }
  }
}

void print_json(const Report& r, std::ostream& out) {
  const bool peak = r.peak_gbs > 0;
  out << "{\n  \"device\": {\"kind\": " << quoted(r.device_kind) << ", \"name\": " << quoted(r.device_name)
      << ", \"chip\": " << (r.chip.chip.empty() ? "null" : quoted(r.chip.chip))
      << ", \"peak_gb_s\": " << number(r.peak_gbs, peak) << "},\n";
  out << "  \"note\": " << (r.device_kind == "cpu" ? quoted(kCpuNote) : "null") << ",\n";
  out << "  \"quick\": " << (r.quick ? "true" : "false") << ", \"repeats\": " << r.repeats
      << ", \"dispatches_per_timing\": " << r.dispatches << ", \"tokens_per_timing\": " << r.tokens << ",\n";
  out << "  \"shapes\": [";
  for (size_t i = 0; i < r.shapes.size(); ++i) {
    const ShapeResult& s = r.shapes[i];
    out << (i ? "," : "") << "\n    {\"shape\": " << quoted(s.shape) << ", \"note\": " << quoted(s.note)
        << ", \"error\": " << (s.error.empty() ? "null" : quoted(s.error)) << ", \"context\": " << s.context
        << ",\n     \"kernels\": [";
    for (size_t j = 0; j < s.kernels.size(); ++j) {
      const KernelResult& k = s.kernels[j];
      const double bw = gb_s(k.bytes, k.us_per_dispatch);
      const bool modelled = k.bytes > 0;
      out << (j ? "," : "") << "\n      {\"kernel\": " << quoted(k.kernel) << ", \"sizes\": " << quoted(k.sizes)
          << ", \"per_step\": " << k.per_step << ", \"us_per_dispatch\": " << number(k.us_per_dispatch)
          << ", \"bytes\": " << number(k.bytes, modelled) << ", \"flops\": " << number(k.flops, modelled)
          << ", \"gb_s\": " << number(bw, modelled)
          << ", \"peak_pct\": " << number(100 * bw / r.peak_gbs, modelled && peak)
          << ", \"gflop_s\": " << number(k.flops / k.us_per_dispatch / 1e3, modelled && k.us_per_dispatch > 0) << "}";
    }
    out << "],\n     \"decode_step\": ";
    if (!s.step) {
      out << "null}";
      continue;
    }
    const StepResult& t = *s.step;
    const double limit_us = peak ? t.bytes_per_token / (r.peak_gbs * 1e3) : 0;
    out << "{\"us_per_token\": " << number(t.us_per_token) << ", \"tokens_per_s\": " << number(1e6 / t.us_per_token)
        << ", \"bytes_per_token\": " << number(t.bytes_per_token)
        << ", \"weight_bytes_per_token\": " << t.weight_bytes_per_token << ", \"dispatches\": " << t.dispatches
        << ", \"barriers\": " << t.barriers << ", \"host_encode_us\": " << number(t.host_encode_us)
        << ", \"limit_us_per_token\": " << number(limit_us, peak)
        << ", \"share_of_limit\": " << number(limit_us / t.us_per_token, peak) << "}}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace mq::bench
