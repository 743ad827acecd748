// K-norm (as kvpress's KnormPress): keep the keys with the lowest L2 norm, which
// correlate with high attention. No recent window by default.
#include <cmath>

#include "policies/policy.h"

namespace kvevict {
namespace {
class KnormPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "knorm"; }
  double default_heavy_share() const override { return 1.0; }
  // Norms are rounded to 12 significant bits: the same token's key has the same norm
  // at every position (RoPE is a rotation), and rounding makes those exact ties, broken
  // by position, instead of ties decided by float noise that differs between modes.
  void on_append(HeadSlots&, float* slot, int, const NewToken& token) const override {
    int exponent = 0;
    const float mantissa = std::frexp(token.key_norm, &exponent);
    slot[0] = std::ldexp(std::round(mantissa * 4096.0f) / 4096.0f, exponent);
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = -head.values[s];
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::NegativeKeyNorm; }
};
}  // namespace

std::unique_ptr<Policy> make_knorm_policy(const PolicyOptions& o) {
  return std::make_unique<KnormPolicy>(o);
}
}  // namespace kvevict
