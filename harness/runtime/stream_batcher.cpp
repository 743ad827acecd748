#include "harness/runtime/stream_batcher.h"

#include "harness/common/errors.h"

namespace kvevict {

StreamBatcher::StreamBatcher(const Model& model, int batch_size) : model_(model), batch_size_(batch_size) {
  if (batch_size < 1) throw Error("batch size " + std::to_string(batch_size) + " must be at least 1");
  stats_.calls_of_size.assign(batch_size + 1, 0);
  thread_ = std::thread([this] { drive(); });
}

StreamBatcher::~StreamBatcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  submitted_.notify_all();
  thread_.join();
}

void StreamBatcher::submit(BatchStream& stream, Finished finished) {
  if (stream.done()) throw Error("internal: a finished stream submitted to the batcher");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Error("internal: a stream submitted to a batcher that is stopping");
    waiting_.emplace_back(&stream, std::move(finished));
  }
  submitted_.notify_one();
}

void StreamBatcher::run(BatchStream& stream) { run(std::vector<BatchStream*>{&stream}); }

void StreamBatcher::run(const std::vector<BatchStream*>& streams) {
  std::mutex mutex;
  std::condition_variable ended;
  size_t running = 0;
  std::exception_ptr first_error;
  std::exception_ptr refused;  // a stream submit() refused: those submitted before it still end first
  for (BatchStream* stream : streams) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++running;
    }
    try {
      // Notified under the lock: once it is released this function may return.
      submit(*stream, [&](std::exception_ptr error) {
        std::lock_guard<std::mutex> lock(mutex);
        if (error && !first_error) first_error = error;
        --running;
        ended.notify_one();
      });
    } catch (...) {
      refused = std::current_exception();
      std::lock_guard<std::mutex> lock(mutex);
      --running;
      break;
    }
  }
  std::unique_lock<std::mutex> lock(mutex);
  ended.wait(lock, [&] { return running == 0; });
  if (refused) std::rethrow_exception(refused);
  if (first_error) std::rethrow_exception(first_error);
}

StreamBatcher::Stats StreamBatcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats now = stats_;
  now.running = static_cast<int>(running_.size());
  now.waiting = static_cast<int>(waiting_.size());
  return now;
}

void StreamBatcher::drive() {
  // The finished callbacks run outside the lock: a submitter may submit again from one.
  auto join = [this](bool idle) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (idle) submitted_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return JoiningStream{};  // idle: only when stopping, which ends the run
    auto [stream, finished] = std::move(waiting_.front());
    waiting_.pop_front();
    running_.emplace(stream, std::move(finished));
    return JoiningStream{0, stream};
  };
  auto leave = [this](BatchStream& stream, std::exception_ptr error) {
    Finished finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto entry = running_.find(&stream);
      finished = std::move(entry->second);
      running_.erase(entry);
    }
    finished(error);
  };
  auto ran = [this](int segments) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.model_calls;
    stats_.segments += segments;
    stats_.largest = std::max(stats_.largest, segments);
    ++stats_.calls_of_size.at(segments);
  };
  for (;;) {
    try {
      run_continuous(model_, batch_size_, join, [&](int, BatchStream& stream) { leave(stream, nullptr); }, ran);
      return;  // idle and stopping
    } catch (...) {
      // A model call failed: every stream in the batch is in no known state, so each gets
      // the error; those still waiting run on.
      const std::exception_ptr error = std::current_exception();
      std::vector<BatchStream*> failed;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& entry : running_) failed.push_back(entry.first);
      }
      for (BatchStream* stream : failed) leave(*stream, error);
    }
  }
}

}  // namespace kvevict
