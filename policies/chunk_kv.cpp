#include "policies/chunk_kv.h"

#include <algorithm>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

// The inner policy's state, budget and score; only the score is pooled by chunk.
class ChunkKVPolicy : public ScoredPolicy {
 public:
  ChunkKVPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options)
      : ScoredPolicy(options), inner_(std::move(inner)), scored_(scored) {}

  std::string name() const override { return kChunkPrefix + inner_->name(); }
  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = inner_->parameters();
    params.push_back(&kChunkLength);
    return params;
  }
  bool splits_budget() const override { return inner_->splits_budget(); }
  double default_heavy_share() const override { return inner_->default_heavy_share(); }
  int sink_tokens() const override { return inner_->sink_tokens(); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    return inner_->layer_budget(layer, shape);
  }
  void validate(const SequenceShape& shape) const override { inner_->validate(shape); }
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override {
    return inner_->states_agree(a, b);
  }
  TokenVectors token_vectors() const override { return scored_.token_vectors(); }

  int channels(int head_dim) const override { return scored_.channels(head_dim); }
  void on_append(HeadSlots& head, float* slot, int position, const NewToken& token) const override {
    scored_.on_append(head, slot, position, token);
  }
  void on_observe(HeadSlots& head, const float* attention) const override { scored_.on_observe(head, attention); }
  void score(const HeadSlots& head, float* out) const override {
    scored_.score(head, out);
    const int n = head.size();
    for (int begin = 0; begin < n;) {
      const int chunk = head.positions[begin] / chunk_length_;
      int end = begin;
      double sum = 0;
      while (end < n && head.positions[end] / chunk_length_ == chunk) sum += out[end++];
      const float mean = static_cast<float>(sum / (end - begin));
      std::fill(out + begin, out + end, mean);
      begin = end;
    }
  }
  bool shared_across_heads() const override { return true; }

 private:
  std::unique_ptr<Policy> inner_;
  const ScoredPolicy& scored_;
  const int chunk_length_ = static_cast<int>(options_.params.integer(kChunkLength));
};

}  // namespace

std::unique_ptr<Policy> make_chunk_kv(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const auto* scored = dynamic_cast<const ScoredPolicy*>(inner.get());
  if (!scored || inner->keeps_everything())
    throw Error("policy " + std::string(kChunkPrefix) + inner->name() + ": \"" + inner->name() +
                "\" is not a scored eviction policy (e.g. chunk+snapkv)");
  return std::make_unique<ChunkKVPolicy>(std::move(inner), *scored, options);
}

}  // namespace kvevict
