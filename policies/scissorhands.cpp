// Scissorhands (persistence of importance): over the last `window` queries, count
// how often each key's attention exceeded the uniform share 1/n; evict the keys
// least often important. The recent window is never evicted.
#include "harness/common/errors.h"
#include "policies/windowed_attention.h"

namespace kvevict {
namespace {
class ScissorhandsPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "scissorhands"; }
  int channels() const override { return options_.window; }
  void on_observe(HeadSlots& head, const float* attention) const override {
    const size_t n = head.positions.size();
    const float threshold = 1.0f / static_cast<float>(n);
    const int channel = head.steps % options_.window;
    for (size_t s = 0; s < n; ++s)
      head.values[s * options_.window + channel] = attention[s] > threshold ? 1.0f : 0.0f;
  }
  void score(const HeadSlots& head, float* out) const override {
    window_sum(head, options_.window, out);
  }
};
}  // namespace

std::unique_ptr<Policy> make_scissorhands_policy(const PolicyOptions& o) {
  if (o.window < 1) throw Error("scissorhands: --window must be at least 1");
  return std::make_unique<ScissorhandsPolicy>(o);
}
}  // namespace kvevict
