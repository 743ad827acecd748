// Local: only the most recent tokens (a sliding window); the whole budget is recent.
#include "policies/policy.h"

namespace kvevict {
namespace {
class LocalPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "local"; }
  double default_heavy_share() const override { return 0.0; }
  bool splits_budget() const override { return false; }
  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    Budget b = Policy::layer_budget(layer, shape);
    b.recent = b.capacity;  // a heavy share means nothing here
    return b;
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = static_cast<float>(head.positions[s]);
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::Position; }
};
}  // namespace

std::unique_ptr<Policy> make_local_policy(const PolicyOptions& o) {
  return std::make_unique<LocalPolicy>(o);
}
}  // namespace kvevict
