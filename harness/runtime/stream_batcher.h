// Continuous batching for streams that arrive from several threads at once (a server's
// requests): one thread drives the model, run_continuous() over whatever has been
// submitted, and each submitter waits for its own stream.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "harness/runtime/scorer.h"

namespace kvevict {

class StreamBatcher {
 public:
  // Starts the thread that runs the model: up to batch_size streams per forward_batch().
  StreamBatcher(const Model& model, int batch_size);
  // Runs every stream submitted so far to its end, then stops the thread.
  ~StreamBatcher();
  StreamBatcher(const StreamBatcher&) = delete;
  StreamBatcher& operator=(const StreamBatcher&) = delete;

  // Called once, on the batcher's thread, as a stream leaves the batch: error is null when
  // the stream is done, else what its model call threw (the call's other streams get it too).
  using Finished = std::function<void(std::exception_ptr error)>;
  // Queues `stream` (not done(); it must live until finished is called) to join the batch
  // at its next free place. Its next()/take() (and what take() calls, such as a
  // generation's on_token) then run on the batcher's thread, between other streams' calls.
  void submit(BatchStream& stream, Finished finished);
  // submit() and wait for the stream's end; rethrows its error. Each segment's logits have
  // the bits of the same call alone (forward_batch), so the result is run_alone()'s.
  void run(BatchStream& stream);
  // Several streams submitted together (they may share a model call), waiting for all of
  // them; then rethrows the first error, if any.
  void run(const std::vector<BatchStream*>& streams);

  int batch_size() const { return batch_size_; }
  struct Stats {
    int64_t model_calls = 0;  // forward_batch() calls
    int64_t segments = 0;     // segments run in them (one per stream per call)
    int largest = 0;          // the most segments in one call so far
    std::vector<int64_t> calls_of_size;  // [batch_size + 1]: calls that ran that many segments
    int running = 0;          // streams in the batch now
    int waiting = 0;          // streams submitted, waiting for a place
  };
  Stats stats() const;

 private:
  void drive();
  const Model& model_;
  const int batch_size_;
  mutable std::mutex mutex_;
  std::condition_variable submitted_;
  std::deque<std::pair<BatchStream*, Finished>> waiting_;
  std::unordered_map<BatchStream*, Finished> running_;  // joined, not yet finished
  bool stopping_ = false;
  Stats stats_;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace kvevict
