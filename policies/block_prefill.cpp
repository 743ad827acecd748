#include "policies/block_prefill.h"

#include "policies/wrapper_policy.h"

namespace kvevict {
namespace {

// The wrapped policy's states as they are; only the driver's compression points change
// (RealisablePolicy::prefill_block).
class BlockPrefillPolicy : public WrapperPolicy<RealisablePolicy> {
 public:
  BlockPrefillPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options)
      : WrapperPolicy(std::move(inner), scored, options, kBlockPrefix, kBlockSize) {}

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    return scored_.make_layer_states(layer, shape);
  }
  int prefill_block() const override { return block_size_; }

 private:
  const int block_size_ = static_cast<int>(options_.params.integer(kBlockSize));
};

}  // namespace

std::unique_ptr<Policy> make_block_prefill(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = wrapped_scored_policy(*inner, kBlockPrefix);
  return std::make_unique<BlockPrefillPolicy>(std::move(inner), scored, options);
}

}  // namespace kvevict
