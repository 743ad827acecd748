// H2O, realisable: heavy hitters by the attention each cached token has received
// from the queries that saw it (accumulated over the kept cache), plus a recent
// window. This is the rule of the paper's real-drop code.
#include "policies/policy.h"

namespace kvevict {
namespace {
class H2OPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "h2o"; }
  void on_observe(HeadSlots& head, const float* attention) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) head.values[s] += attention[s];
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = head.values[s];
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::AttentionSum; }
};
}  // namespace

std::unique_ptr<Policy> make_h2o_policy(const PolicyOptions& o) {
  return std::make_unique<H2OPolicy>(o);
}
}  // namespace kvevict
