#include "weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace mq::engine {

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

Weights::Weights(gpu::Device& device, const ModelDesc& model, const Progress& progress)
    : device_(device), model_(model) {
  uint64_t total = 0, done = 0;
  for (const auto& entry : model.tensors) total += entry.second.nbytes;
  for (const auto& [name, desc] : model.tensors) {
    auto& file = files_[desc.file];
    if (!file) file = std::make_shared<MappedFile>(desc.file);
    if (desc.offset + desc.nbytes > file->size)
      throw std::runtime_error("[weights] tensor " + name + " lies past the end of " + desc.file);
    DeviceTensor t;
    t.desc = &desc;
    if (desc.offset % 16 == 0) {
      t.buffer = file_buffer(desc.file);
      t.offset = desc.offset;
    } else {
      t.buffer = device.new_buffer(desc.nbytes);
      std::memcpy(t.buffer->contents(), static_cast<const char*>(file->data) + desc.offset, desc.nbytes);
      copied_bytes_ += desc.nbytes;
    }
    tensors_[name] = t;
    done += desc.nbytes;
    if (progress) progress(done, total);
  }
}

std::shared_ptr<gpu::Buffer> Weights::file_buffer(const std::string& path) {
  auto& buffer = file_buffers_[path];
  if (!buffer) {
    std::shared_ptr<MappedFile> file = files_.at(path);
    buffer = device_.wrap_host_memory(file->data, file->mapped, file);
  }
  return buffer;
}

DeviceTensor Weights::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error("[weights] the checkpoint has no tensor " + name);
  return it->second;
}

QuantLinear Weights::linear(const std::string& module) const {
  QuantLinear l;
  l.weight = tensor(module + ".weight");
  l.scales = tensor(module + ".scales");
  l.biases = tensor(module + ".biases");
  const TensorDesc& w = *l.weight.desc;
  if (w.bits == 0 || w.dtype != "U32" || w.shape.size() != 2)
    throw std::runtime_error("[weights] " + module + " is not a quantized linear layer (only MLX affine 4/8-bit "
                             "layers are supported)");
  l.bits = w.bits;
  l.group = w.group;
  l.out = uint32_t(w.shape[0]);
  l.in = uint32_t(w.shape[1] * 32 / w.bits);
  return l;
}

}  // namespace mq::engine
