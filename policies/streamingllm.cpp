// StreamingLLM: the first n_sink tokens (attention sinks) plus the most recent window.
#include "policies/policy.h"

namespace kvevict {
namespace {
class StreamingLLMPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "streamingllm"; }
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce, &kSink}; }
  bool splits_budget() const override { return false; }
  int sink_tokens() const override { return static_cast<int>(options_.params.integer(kSink)); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    Budget b = Policy::layer_budget(layer, shape);
    b.recent = b.capacity - b.sink;  // no heavy hitters
    return b;
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = static_cast<float>(head.positions[s]);
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::Position; }
};
}  // namespace

std::unique_ptr<Policy> make_streamingllm_policy(const PolicyOptions& o) {
  return std::make_unique<StreamingLLMPolicy>(o);
}
}  // namespace kvevict
