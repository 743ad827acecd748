// SnapKV: the attention of the last `window` queries to each key, summed and pooled
// along the keys; the best-scoring keys plus the recent window stay. At a prefill
// boundary this is SnapKV's prefill compression; during decoding the same score
// over the most recent window keeps the cache at its budget.
#pragma once
#include "policies/windowed_attention.h"

namespace kvevict {

class SnapKVPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "snapkv"; }
  int channels() const override { return options_.window; }
  void on_observe(HeadSlots& head, const float* attention) const override {
    record_window(head, attention, options_.window);
  }
  void score(const HeadSlots& head, float* out) const override {
    window_sum(head, options_.window, out);
    pool_keys(out, static_cast<int>(head.positions.size()), options_.kernel,
              options_.pooling == "max");
  }
};

}  // namespace kvevict
