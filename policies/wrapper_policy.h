// A policy that wraps a scored policy (ada+SCORED, chunk+SCORED): its name, parameters,
// budget and checks are the inner policy's, with the wrapper's prefix and own parameter
// added; the wrapper decides only how the inner scores become a kept set.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {

template <typename Base>
class WrapperPolicy : public Base {
 public:
  WrapperPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options,
                const char* prefix, const ParamSpec& own_parameter)
      : Base(options), inner_(std::move(inner)), scored_(scored), prefix_(prefix), own_parameter_(own_parameter) {}

  std::string name() const override { return prefix_ + inner_->name(); }
  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = inner_->parameters();
    params.push_back(&own_parameter_);
    return params;
  }
  bool splits_budget() const override { return inner_->splits_budget(); }
  double default_heavy_share() const override { return inner_->default_heavy_share(); }
  int sink_tokens() const override { return inner_->sink_tokens(); }
  Prepass prepass() const override { return inner_->prepass(); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override { return inner_->layer_budget(layer, shape); }
  void validate(const SequenceShape& shape) const override { inner_->validate(shape); }
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override {
    return inner_->states_agree(a, b);
  }
  TokenVectors token_vectors() const override { return scored_.token_vectors(); }

 protected:
  std::unique_ptr<Policy> inner_;  // owns `scored_`
  const ScoredPolicy& scored_;

 private:
  std::string prefix_;
  const ParamSpec& own_parameter_;
};

// The scored policy that `prefix` + inner's name wraps; kvevict::Error naming both when
// `inner` is not a scored policy that evicts.
inline const ScoredPolicy& wrapped_scored_policy(const Policy& inner, const char* prefix) {
  const auto* scored = dynamic_cast<const ScoredPolicy*>(&inner);
  if (!scored || inner.keeps_everything())
    throw Error("policy " + std::string(prefix) + inner.name() + ": \"" + inner.name() +
                "\" is not a scored eviction policy (e.g. " + prefix + "snapkv)");
  return *scored;
}

}  // namespace kvevict
