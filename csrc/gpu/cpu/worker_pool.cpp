#include "worker_pool.h"

#include <cstdlib>
#include <string>

namespace mq::cpu {

WorkerPool& WorkerPool::instance() {
  static WorkerPool pool([] {
    const char* env = std::getenv("METALQWEN_CPU_THREADS");
    int n = env ? std::atoi(env) : 0;
    return unsigned(n > 0 ? n : std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

WorkerPool::WorkerPool(unsigned workers) {
  for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::run(size_t count, const std::function<void(size_t)>& task) {
  if (count == 0) return;
  std::lock_guard<std::mutex> one_run(run_mutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = &task;
  count_ = count;
  next_ = 0;
  error_ = nullptr;
  active_ = threads_.size();
  ++generation_;
  wake_.notify_all();
  finished_.wait(lock, [this] { return active_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::work() {
  unsigned seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    while (next_ < count_ && !error_) {
      size_t item = next_++;
      lock.unlock();
      try {
        (*task_)(item);
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        continue;
      }
      lock.lock();
    }
    if (--active_ == 0) finished_.notify_all();
  }
}

}  // namespace mq::cpu
