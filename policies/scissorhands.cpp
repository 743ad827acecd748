// Scissorhands (persistence of importance): over the last `window` queries, count
// how often each key's attention exceeded the uniform share 1/n; evict the keys
// least often important. The recent window is never evicted.
#include "policies/windowed_attention.h"

namespace kvevict {
namespace {
class ScissorhandsPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "scissorhands"; }
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce, &kWindow}; }
  int channels(int) const override { return window_; }
  void on_observe(HeadSlots& head, const float* attention) const override {
    const size_t n = head.positions.size();
    const float threshold = 1.0f / static_cast<float>(n);
    const int channel = head.steps % window_;
    for (size_t s = 0; s < n; ++s)
      head.values[s * window_ + channel] = attention[s] > threshold ? 1.0f : 0.0f;
  }
  void score(const HeadSlots& head, float* out) const override {
    window_sum(head, window_, out);
  }

 private:
  const int window_ = static_cast<int>(options_.params.integer(kWindow));
};
}  // namespace

std::unique_ptr<Policy> make_scissorhands_policy(const PolicyOptions& o) {
  return std::make_unique<ScissorhandsPolicy>(o);
}
}  // namespace kvevict
