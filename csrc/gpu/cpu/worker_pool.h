// A persistent pool of OS threads that threadgroups are spread over.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mq::cpu {

class WorkerPool {
 public:
  // Sized by METALQWEN_CPU_THREADS, else the number of cores.
  static WorkerPool& instance();
  explicit WorkerPool(unsigned workers);
  ~WorkerPool();

  // Calls task(i) for every i in [0, count) across the workers and returns when
  // all are done. After the first exception no new items start; it is rethrown.
  void run(size_t count, const std::function<void(size_t)>& task);

 private:
  void work();

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t count_ = 0, next_ = 0, active_ = 0;
  unsigned generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace mq::cpu
