// TOVA: keep the tokens the newest query attends to most, averaged over all heads of
// the layer (one decision per layer). No recent window by default.
#include "policies/policy.h"

namespace kvevict {
namespace {
class TovaPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "tova"; }
  double default_heavy_share() const override { return 1.0; }
  bool shared_across_heads() const override { return true; }
  void on_observe(HeadSlots& head, const float* attention) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) head.values[s] = attention[s];
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = head.values[s];
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::LatestAttention; }
};
}  // namespace

std::unique_ptr<Policy> make_tova_policy(const PolicyOptions& o) {
  return std::make_unique<TovaPolicy>(o);
}
}  // namespace kvevict
