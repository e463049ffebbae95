#include "weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "process_memory.h"

namespace mq::engine {
namespace {

constexpr uint64_t kTensorAlign = 16;  // the kernels' vector loads (shaders/README.md)

uint64_t align_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

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

// A shard open for reading (until done_reading), and its read-only mapping (whole pages), which
// wrapped spans keep alive: unmapped when the last of them goes.
struct Weights::ShardFile {
  std::string path;
  int fd = -1;
  void* data = nullptr;
  size_t size = 0;     // file size
  size_t mapped = 0;   // mapping length (whole pages)
  explicit ShardFile(const std::string& file_path) : path(file_path) {
    fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("[weights] cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    fstat(fd, &st);
    size = size_t(st.st_size);
    const size_t page = size_t(getpagesize());
    mapped = (size + page - 1) / page * page;
    data = mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      close(fd);
      throw std::runtime_error("[weights] cannot map " + path + ": " + std::strerror(error));
    }
  }
  void done_reading() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~ShardFile() {
    munmap(data, mapped);
    done_reading();
  }
};

Weights::Weights(gpu::Device& device, const ModelDesc& model, const Progress& progress) {
  rss_before_ = peak_rss_ = resident_set_bytes();
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
  sample_rss();
  device.make_resident(buffers_);
}

void Weights::sample_rss() { peak_rss_ = std::max(peak_rss_, resident_set_bytes()); }

void Weights::place_file(gpu::Device& device, const std::string& path, std::vector<const Entry*> entries,
                         const std::function<void(uint64_t)>& placed) {
  auto file = std::make_shared<ShardFile>(path);
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
    auto buffer = device.wrap_host_memory(static_cast<char*>(file->data) + span.begin, span.end - span.begin, file,
                                          gpu::Access::read_only);
    buffers_.push_back(buffer);
    for (const Entry* e : span.tensors)
      tensors_[e->first] = DeviceTensor{buffer, e->second.offset - span.begin, &e->second};
    span = Span{};
    sample_rss();
  };
  std::vector<const Entry*> in_arenas;
  for (const Entry* e : entries) {
    const TensorDesc& t = e->second;
    if (t.offset + t.nbytes > file->size)
      throw std::runtime_error("[weights] tensor " + e->first + " lies past the end of " + path);
    const uint64_t begin = t.offset / page * page, end = (t.offset + t.nbytes + page - 1) / page * page;
    // Widened, misaligned for the kernels, or its pages exceed a buffer: into an arena.
    if (widened_on_load(t) || t.offset % kTensorAlign != 0 || end - begin > limit) {
      in_arenas.push_back(e);
      continue;
    }
    if (!span.tensors.empty() && end - span.begin > limit) wrap_span();
    if (span.tensors.empty()) span.begin = begin;
    span.end = std::max(span.end, end);
    span.tensors.push_back(e);
    placed(t.nbytes);
  }
  wrap_span();
  place_arenas(device, *file, in_arenas, placed);
  file->done_reading();
}

// Lays `entries` (file order) out back to back at aligned offsets in arenas of at most
// max_buffer_length bytes, then fills them: file-contiguous tensors placed contiguously are
// one read (a run), widened tensors are converted through a chunk-sized staging buffer.
void Weights::place_arenas(gpu::Device& device, const ShardFile& file, const std::vector<const Entry*>& entries,
                           const std::function<void(uint64_t)>& placed) {
  const uint64_t limit = device.max_buffer_length();
  std::vector<uint64_t> arena_bytes;
  std::vector<ArenaSlot> slots;
  for (const Entry* e : entries) {
    const uint64_t bytes = placed_bytes(e->second);
    if (bytes > limit)
      throw gpu::GpuError("[weights] tensor " + e->first + " is " + std::to_string(bytes) + " bytes, more than " +
                          device.name() + "'s largest buffer (" + std::to_string(limit) + " bytes)");
    uint64_t offset = arena_bytes.empty() ? 0 : align_up(arena_bytes.back(), kTensorAlign);
    if (arena_bytes.empty() || offset + bytes > limit) {
      arena_bytes.push_back(0);
      offset = 0;
    }
    slots.push_back({e, arena_bytes.size() - 1, offset});
    arena_bytes.back() = offset + bytes;
  }
  std::vector<std::shared_ptr<gpu::Buffer>> arenas;
  for (uint64_t bytes : arena_bytes) arenas.push_back(device.new_buffer(bytes, gpu::Access::read_only));
  buffers_.insert(buffers_.end(), arenas.begin(), arenas.end());

  for (size_t i = 0; i < slots.size();) {
    const ArenaSlot& first = slots[i];
    const TensorDesc& t = first.entry->second;
    char* base = static_cast<char*>(arenas[first.arena]->contents());
    if (widened_on_load(t)) {
      TensorDesc& wide = widened_[first.entry->first] = t;
      wide.dtype = "F32";
      wide.nbytes = placed_bytes(t);
      wide.add = 0.0f;  // the copy holds the shifted values
      widen(file, *first.entry, reinterpret_cast<float*>(base + first.offset), placed);
      tensors_[first.entry->first] = DeviceTensor{arenas[first.arena], first.offset, &wide};
      copied_bytes_ += wide.nbytes;
      i += 1;
      continue;
    }
    // The run: the following slots that continue both the file and the arena without a gap.
    size_t next = i + 1;
    uint64_t bytes = t.nbytes;
    while (next < slots.size()) {
      const ArenaSlot& s = slots[next];
      const TensorDesc& u = s.entry->second;
      if (widened_on_load(u) || s.arena != first.arena || u.offset != t.offset + bytes ||
          s.offset != first.offset + bytes)
        break;
      bytes += u.nbytes;
      next += 1;
    }
    read_run(file, t.offset, bytes, base + first.offset, placed);
    for (size_t k = i; k < next; ++k)
      tensors_[slots[k].entry->first] = DeviceTensor{arenas[first.arena], slots[k].offset, &slots[k].entry->second};
    copied_bytes_ += bytes;
    i = next;
  }
}

// pread in chunks of kReadChunk (a single read of more than 2 GiB fails on macOS).
void Weights::read_run(const ShardFile& file, uint64_t offset, uint64_t bytes, char* dst,
                       const std::function<void(uint64_t)>& placed) {
  uint64_t done = 0;
  while (done < bytes) {
    const size_t want = size_t(std::min(bytes - done, kReadChunk));
    const ssize_t got = pread(file.fd, dst + done, want, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw std::runtime_error("[weights] cannot read " + file.path + " at byte " + std::to_string(offset + done) +
                               ": " + (got < 0 ? std::strerror(errno) : "the file ended early"));
    done += uint64_t(got);
    placed(uint64_t(got));
    sample_rss();
  }
}

void Weights::widen(const ShardFile& file, const Entry& entry, float* dst,
                    const std::function<void(uint64_t)>& placed) {
  const TensorDesc& t = entry.second;
  if (t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F32")
    throw std::runtime_error("[weights] tensor " + entry.first + ": cannot shift a " + t.dtype + " tensor at load");
  const uint64_t width = t.dtype == "F32" ? 4 : 2, count = t.nbytes / width;
  const uint64_t per_chunk = kReadChunk / width;
  std::vector<char> staging(size_t(std::min(count, per_chunk) * width));
  for (uint64_t first = 0; first < count; first += per_chunk) {
    const uint64_t n = std::min(per_chunk, count - first);
    read_run(file, t.offset + first * width, n * width, staging.data(), [&](uint64_t) {});
    for (uint64_t i = 0; i < n; ++i) {
      float v;
      if (t.dtype == "F32") {
        std::memcpy(&v, staging.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, staging.data() + 2 * i, 2);
        if (t.dtype == "F16") {
          v = half_to_float(h);
        } else {
          const uint32_t bits = uint32_t(h) << 16;  // bf16: the top half of an f32
          std::memcpy(&v, &bits, 4);
        }
      }
      dst[first + i] = v + t.add;
    }
    placed(n * width);
    sample_rss();
  }
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
