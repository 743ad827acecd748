// SnapKV: the attention of the last `window` queries to each key, summed and pooled
// along the keys; the best-scoring keys plus the recent window stay. At a prefill
// boundary this is SnapKV's prefill compression; during decoding the same score
// over the most recent window keeps the cache at its budget.
#pragma once
#include "policies/windowed_attention.h"

namespace kvevict {

inline const ParamSpec kKernel = ParamSpec::integer("kernel", 5, "snapkv/pyramidkv: pooling kernel").at_least(1).odd();
inline const ParamSpec kPooling = ParamSpec::choice("pooling", {"avg", "max"}, "snapkv/pyramidkv: pooling");

class SnapKVPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "snapkv"; }
  std::vector<const ParamSpec*> parameters() const override {
    return {&kGroupReduce, &kWindow, &kKernel, &kPooling};
  }
  int channels(int) const override { return running_window_channels(window_); }
  void on_observe(HeadSlots& head, const float* attention) const override {
    record_running_window(head, attention, window_);
  }
  void score(const HeadSlots& head, float* out) const override {
    running_window_sum(head, window_, out);
    pool_keys(out, static_cast<int>(head.positions.size()), kernel_, use_max_);
  }
  // The ring holds the last `window` observations; channel 0's write restarts the running
  // sum, so what came before them is never read.
  int observation_window() const override { return window_; }

 private:
  const int window_ = static_cast<int>(options_.params.integer(kWindow));
  const int kernel_ = static_cast<int>(options_.params.integer(kKernel));
  const bool use_max_ = options_.params.text(kPooling) == "max";
};

}  // namespace kvevict
