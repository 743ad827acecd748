// The eviction hook: the attention backends of the two execution modes.
//   FullAttention   plain causal attention (no policy);
//   SimAttention    one teacher-forced pass; each logits row is masked by the
//                   policy's current keep-set and the policy observes the masked
//                   softmax (or, for sim-only policies, computes the layer itself);
//   CacheAttention  a real KV cache; the policy observes each query's attention and
//                   evicted K/V are physically removed.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "harness/model/model.h"
#include "policies/policy.h"

namespace kvevict {

// What the cache held, for reports.
struct KvStats {
  std::vector<int> kept_per_layer;     // tokens per KV head at the end
  std::vector<int> max_per_layer;      // most tokens per KV head at any moment
  int64_t peak_bytes = 0;              // sum over layers of each layer's peak K+V bytes
  // The model's sliding window (0: none). With one, the last query of a layer sees only
  // visible_per_layer of the kept tokens (at most the window), so a budget above the
  // window buys nothing.
  int64_t sliding_window = 0;
  std::vector<int> visible_per_layer;  // keys the last query could attend to (most over KV heads)
};

class FullAttention : public AttentionBackend {
 public:
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
};

class SimAttention : public AttentionBackend {
 public:
  SimAttention(const Model& model, const Policy& policy, SequenceShape shape);
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
  const KvStats& stats() const { return stats_; }

 private:
  // Attention output [T, Hq*d] under a realisable policy, Scalar the accumulation type.
  template <typename Scalar>
  torch::Tensor simulate_realisable(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v);
  const Model& model_;
  const Policy& policy_;
  SequenceShape shape_;
  KvStats stats_;
};

class CacheAttention : public AttentionBackend {
 public:
  CacheAttention(const Model& model, const Policy& policy, SequenceShape shape);
  // t > 1 processes a block with full causal attention: allowed only up to the end of
  // the prefill (shape.prefill_len), since eviction never happens inside a block.
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
  const KvStats& stats() const { return stats_; }
  int64_t cached_tokens(int layer) const;
  // Bytes of K/V memory the cache holds now (allocated rows, all layers).
  int64_t held_bytes() const;
  // Wall time spent inside attend() (scores, softmax, values, policy, eviction).
  double attention_seconds() const { return attention_seconds_; }

 private:
  struct LayerCache {
    torch::Tensor key_buffer, value_buffer;  // [n_kv_heads, capacity, head_dim]
    int64_t size = 0;                         // rows in use
    std::vector<std::vector<int>> rows;       // per KV head: cache row of each policy slot
    std::vector<std::vector<int64_t>> row_positions;  // per KV head: position of each row (sliding window only)
    std::unique_ptr<LayerState> state;
  };
  void evict(LayerCache& cache, const std::vector<std::vector<int>>& keep);
  torch::Tensor window_mask(LayerCache& cache, int64_t start, int64_t t, int layer);
  const Model& model_;
  const Policy& policy_;
  SequenceShape shape_;
  std::vector<LayerCache> layers_;
  KvStats stats_;
  std::vector<float> row_buffer_;
  double attention_seconds_ = 0;
};

}  // namespace kvevict
