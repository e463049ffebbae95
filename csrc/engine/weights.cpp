#include "weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace mq::engine {
namespace {

// IEEE half -> float, exact (subnormals, infinities and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

// Unquantized matrices have f16 kernels; every other F16 tensor is read as f32, and so is
// a tensor shifted at load.
bool widened_on_load(const TensorDesc& t) {
  return (t.dtype == "F16" && !(t.bits == 0 && t.shape.size() == 2)) || t.add != 0.0f;
}

uint64_t placed_bytes(const TensorDesc& t) {
  return widened_on_load(t) ? t.nbytes / (t.dtype == "F32" ? 4 : 2) * 4 : t.nbytes;
}

// A read-only mapping of a whole file, unmapped when the last buffer using it goes.
struct Weights::MappedFile {
  void* data = nullptr;
  size_t size = 0;     // file size
  size_t mapped = 0;   // mapping length (whole pages)
  explicit MappedFile(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("[weights] cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    fstat(fd, &st);
    size = size_t(st.st_size);
    const size_t page = size_t(getpagesize());
    mapped = (size + page - 1) / page * page;
    data = mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (data == MAP_FAILED) throw std::runtime_error("[weights] cannot map " + path + ": " + std::strerror(errno));
  }
  ~MappedFile() { munmap(data, mapped); }
};

Weights::Weights(gpu::Device& device, const ModelDesc& model, const Progress& progress) {
  uint64_t total = 0, done = 0;
  std::map<std::string, std::vector<const Entry*>> by_file;
  for (const Entry& entry : model.tensors) {
    total += entry.second.nbytes;
    by_file[entry.second.file].push_back(&entry);
  }
  for (auto& [path, entries] : by_file) {
    place_file(device, path, std::move(entries), [&](uint64_t bytes) {
      done += bytes;
      if (progress) progress(done, total);
    });
  }
}

void Weights::place_file(gpu::Device& device, const std::string& path, std::vector<const Entry*> entries,
                         const std::function<void(uint64_t)>& placed) {
  auto file = std::make_shared<MappedFile>(path);
  std::sort(entries.begin(), entries.end(),
            [](const Entry* a, const Entry* b) { return a->second.offset < b->second.offset; });
  const uint64_t page = uint64_t(getpagesize()), limit = device.max_buffer_length();
  // Whole pages [begin, end) of the file holding `tensors`, wrapped as one buffer once
  // the next tensor would take it past the device's buffer limit.
  struct Span {
    uint64_t begin = 0, end = 0;
    std::vector<const Entry*> tensors;
  } span;
  auto wrap_span = [&] {
    if (span.tensors.empty()) return;
    auto buffer = device.wrap_host_memory(static_cast<char*>(file->data) + span.begin, span.end - span.begin, file);
    buffer_count_ += 1;
    for (const Entry* e : span.tensors) tensors_[e->first] = DeviceTensor{buffer, e->second.offset - span.begin, &e->second};
    span = Span{};
  };
  for (const Entry* e : entries) {
    const TensorDesc& t = e->second;
    if (t.offset + t.nbytes > file->size)
      throw std::runtime_error("[weights] tensor " + e->first + " lies past the end of " + path);
    const uint64_t begin = t.offset / page * page, end = (t.offset + t.nbytes + page - 1) / page * page;
    if (widened_on_load(t)) {
      tensors_[e->first] = widen_tensor(device, *file, *e);
    } else if (t.offset % 16 != 0 || end - begin > limit) {  // misaligned for the kernels, or its pages exceed a buffer
      tensors_[e->first] = copy_tensor(device, *file, *e);
    } else {
      if (!span.tensors.empty() && end - span.begin > limit) wrap_span();
      if (span.tensors.empty()) span.begin = begin;
      span.end = std::max(span.end, end);
      span.tensors.push_back(e);
    }
    placed(t.nbytes);
  }
  wrap_span();
}

DeviceTensor Weights::copy_tensor(gpu::Device& device, const MappedFile& file, const Entry& entry) {
  const TensorDesc& t = entry.second;
  if (t.nbytes > device.max_buffer_length())
    throw gpu::GpuError("[weights] tensor " + entry.first + " is " + std::to_string(t.nbytes) + " bytes, more than " +
                        device.name() + "'s largest buffer (" + std::to_string(device.max_buffer_length()) + " bytes)");
  DeviceTensor copy{device.new_buffer(t.nbytes), 0, &t};
  std::memcpy(copy.buffer->contents(), static_cast<const char*>(file.data) + t.offset, t.nbytes);
  copied_bytes_ += t.nbytes;
  buffer_count_ += 1;
  return copy;
}

DeviceTensor Weights::widen_tensor(gpu::Device& device, const MappedFile& file, const Entry& entry) {
  const TensorDesc& t = entry.second;
  if (t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F32")
    throw std::runtime_error("[weights] tensor " + entry.first + ": cannot shift a " + t.dtype + " tensor at load");
  TensorDesc& wide = widened_[entry.first] = t;
  wide.dtype = "F32";
  wide.nbytes = placed_bytes(t);
  wide.add = 0.0f;  // the copy holds the shifted values
  DeviceTensor copy{device.new_buffer(wide.nbytes), 0, &wide};
  const char* src = static_cast<const char*>(file.data) + t.offset;
  float* dst = static_cast<float*>(copy.buffer->contents());
  for (uint64_t i = 0; i < wide.nbytes / 4; ++i) {
    float v;
    if (t.dtype == "F32") {
      std::memcpy(&v, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if (t.dtype == "F16") {
        v = half_to_float(h);
      } else {
        const uint32_t bits = uint32_t(h) << 16;  // bf16: the top half of an f32
        std::memcpy(&v, &bits, 4);
      }
    }
    dst[i] = v + t.add;
  }
  copied_bytes_ += wide.nbytes;
  buffer_count_ += 1;
  return copy;
}

DeviceTensor Weights::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error("[weights] the checkpoint has no tensor " + name);
  return it->second;
}

QuantLinear Weights::linear(const std::string& module) const {
  static const std::map<std::string, std::string> kFloat = {{"BF16", "bf16"}, {"F16", "f16"}, {"F32", "f32"}};
  QuantLinear l;
  l.weight = tensor(module + ".weight");
  const TensorDesc& w = *l.weight.desc;
  const size_t n = w.shape.size();
  if (n != 2 && n != 3)
    throw std::runtime_error("[weights] " + module + ".weight is not a matrix (or a stack of expert matrices)");
  l.experts = n == 3 ? uint32_t(w.shape[0]) : 0;
  l.out = uint32_t(w.shape[n - 2]);
  if (w.bits == 0) {
    auto f = kFloat.find(w.dtype);
    if (f == kFloat.end())
      throw std::runtime_error("[weights] " + module + ".weight: " + w.dtype + " is neither quantized nor float");
    l.format = f->second;
    l.in = uint32_t(w.shape[n - 1]);
    return l;
  }
  if (w.dtype != "U32") throw std::runtime_error("[weights] " + module + ".weight: quantized weights must be U32");
  l.scales = tensor(module + ".scales");
  if (w.mode == "affine") {
    l.biases = tensor(module + ".biases");
    l.format = "b" + std::to_string(w.bits) + "_g" + std::to_string(w.group);
    if (l.scales.desc->dtype == "F32") l.format += "_sf32";  // f32 in the file, or widened from f16
  } else if (w.mode == "mxfp4" || w.mode == "nvfp4" || w.mode == "mxfp8") {
    l.format = w.mode;
  } else {
    throw std::runtime_error("[weights] " + module + ": unknown quantization mode '" + w.mode + "'");
  }
  l.in = uint32_t(w.shape[n - 1] * 32 / w.bits);
  return l;
}

}  // namespace mq::engine
