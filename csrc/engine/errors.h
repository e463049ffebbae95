// Errors of the engine; the bindings turn them into metalqwen.errors.EngineError and
// ContextFullError. A throw leaves the engine usable (state as of the last finished step).
#pragma once
#include <stdexcept>

namespace mq::engine {

class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// More tokens than max_context: the caches are sized for it.
class ContextFull : public EngineError {
 public:
  using EngineError::EngineError;
};

}  // namespace mq::engine
