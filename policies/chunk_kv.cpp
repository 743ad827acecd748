#include "policies/chunk_kv.h"

#include <algorithm>

#include "policies/wrapper_policy.h"

namespace kvevict {
namespace {

// The inner policy's state, budget and score; only the score is pooled by chunk.
class ChunkKVPolicy : public WrapperPolicy<ScoredPolicy> {
 public:
  ChunkKVPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options)
      : WrapperPolicy(std::move(inner), scored, options, kChunkPrefix, kChunkLength) {}

  int channels(int head_dim) const override { return scored_.channels(head_dim); }
  void on_create(HeadSlots& head, const SequenceShape& shape) const override { scored_.on_create(head, shape); }
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
  const int chunk_length_ = static_cast<int>(options_.params.integer(kChunkLength));
};

}  // namespace

std::unique_ptr<Policy> make_chunk_kv(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = wrapped_scored_policy(*inner, kChunkPrefix);
  return std::make_unique<ChunkKVPolicy>(std::move(inner), scored, options);
}

}  // namespace kvevict
