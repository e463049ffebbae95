// The bookkeeping behind Device::make_resident / resident(), shared by both devices: the
// buffers declared resident, held weakly so a buffer freed leaves the count. Thread-safe.
#pragma once
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "gpu/device.h"

namespace mq::gpu {

class ResidentLedger {
 public:
  // The buffers of `buffers` not declared before (the rest were already counted).
  std::vector<std::shared_ptr<Buffer>> add(const std::vector<std::shared_ptr<Buffer>>& buffers) {
    std::lock_guard<std::mutex> lock(mutex_);
    prune();
    std::vector<std::shared_ptr<Buffer>> added;
    for (const auto& buffer : buffers) {
      if (!buffer) continue;
      auto same = [&](const std::weak_ptr<Buffer>& known) { return known.lock() == buffer; };
      if (std::none_of(buffers_.begin(), buffers_.end(), same) &&
          std::find(added.begin(), added.end(), buffer) == added.end())
        added.push_back(buffer);
    }
    buffers_.insert(buffers_.end(), added.begin(), added.end());
    return added;
  }

  Residency count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Residency r;
    for (const auto& known : buffers_) {
      if (auto buffer = known.lock()) {
        r.buffers += 1;
        r.bytes += buffer->size();
      }
    }
    return r;
  }

 private:
  void prune() {
    buffers_.erase(std::remove_if(buffers_.begin(), buffers_.end(), [](const auto& b) { return b.expired(); }),
                   buffers_.end());
  }
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<Buffer>> buffers_;
};

}  // namespace mq::gpu
