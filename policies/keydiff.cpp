// KeyDiff (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for
// Long-Context LLM Inference", arXiv 2504.15364; kvpress's KeyDiffPress): query-free. Keys
// that point where most keys point add little, so the keys least similar to the anchor,
// the mean of the cache's L2-normalised keys, stay (the paper's key-similarity score):
//
//   anchor = (1/n) sum_j k_j / |k_j|,   score_i = -cos(k_i, anchor)
//
// over the n slots the KV head holds at each compression (post-RoPE keys as cached), so
// decoding re-scores the cache it holds, as the paper's block-wise eviction does with
// blocks of one token. A zero key scores 0 (its cosine is taken as 0, as torch's
// normalize and cosine_similarity give). Sums in double; the score is then rounded to
// float. No recent window by default, as kvpress.
#include <algorithm>
#include <cmath>
#include <vector>

#include "policies/policy.h"

namespace kvevict {
namespace {
class KeyDiffPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "keydiff"; }
  double default_heavy_share() const override { return 1.0; }
  TokenVectors token_vectors() const override { return TokenVectors::Keys; }
  // Each slot keeps its key.
  int channels(int head_dim) const override { return head_dim; }
  void on_append(HeadSlots& head, float* slot, int, const NewToken& token) const override {
    std::copy(token.key, token.key + head.channels, slot);
  }
  void score(const HeadSlots& head, float* out) const override {
    const int n = head.size(), d = head.channels;
    std::vector<double> anchor(d, 0.0), norms(n);
    for (int s = 0; s < n; ++s) {
      const float* key = head.values.data() + static_cast<size_t>(s) * d;
      double squares = 0;
      for (int c = 0; c < d; ++c) squares += static_cast<double>(key[c]) * key[c];
      norms[s] = std::sqrt(squares);
      if (norms[s] > 0)
        for (int c = 0; c < d; ++c) anchor[c] += key[c] / norms[s];
    }
    double anchor_norm = 0;
    for (int c = 0; c < d; ++c) anchor_norm += (anchor[c] / n) * (anchor[c] / n);
    anchor_norm = std::sqrt(anchor_norm);
    for (int s = 0; s < n; ++s) {
      const float* key = head.values.data() + static_cast<size_t>(s) * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += key[c] * (anchor[c] / n);
      const double denominator = norms[s] * anchor_norm;
      out[s] = static_cast<float>(denominator > 0 ? -dot / denominator : 0.0);
    }
  }
};
}  // namespace

std::unique_ptr<Policy> make_keydiff_policy(const PolicyOptions& o) { return std::make_unique<KeyDiffPolicy>(o); }
}  // namespace kvevict
