#include "harness/eval/request_workers.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <vector>

namespace kvevict {

void for_each_request(int count, int workers, const std::function<void(int)>& body,
                      const std::function<void(int)>& finished) {
  workers = std::max(1, std::min(workers, count));
  if (workers == 1) {
    for (int i = 0; i < count; ++i) {
      body(i);
      if (finished) finished(i + 1);
    }
    return;
  }
  std::vector<std::exception_ptr> errors(count);
  std::atomic<bool> failed{false};
  std::mutex finished_mutex;
  int done = 0;
  // Inside this region ATen's parallel_for and Debian's OpenMP OpenBLAS run inline on the
  // calling thread (they check omp_in_parallel), so each request keeps one thread.
  // dynamic,1: requests start in index order, whichever thread is free takes the next.
#pragma omp parallel for num_threads(workers) schedule(dynamic, 1)
  for (int i = 0; i < count; ++i) {
    if (failed.load()) continue;
    try {
      body(i);
      if (finished) {
        std::lock_guard<std::mutex> lock(finished_mutex);
        finished(++done);
      }
    } catch (...) {
      errors[i] = std::current_exception();
      failed.store(true);
    }
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace kvevict
