// The reference: nothing is ever evicted.
#include "policies/policy.h"

namespace kvevict {
namespace {
class FullPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "full"; }
  std::vector<const ParamSpec*> parameters() const override { return {}; }
  bool keeps_everything() const override { return true; }
  void score(const HeadSlots&, float* out) const override {}
};
}  // namespace

std::unique_ptr<Policy> make_full_policy(const PolicyOptions& o) {
  return std::make_unique<FullPolicy>(o);
}
}  // namespace kvevict
