// The H2O paper's lm-eval simulation rule, step for step (PROTOCOLS.md §1), per
// attention head:
//   p_i = softmax of the UNMASKED causal logits of row i;
//   rows i < hb see every earlier key; acc = sum of p over rows < hb, keys < hb;
//   row i >= hb keeps the top-(hb-1) keys by acc plus key i, then acc = (acc + p_i)
//   restricted to that set; the recent band j >= i - rb is OR-ed in.
// Because acc accumulates the unmasked softmax (attention to keys already evicted),
// no real cache can run it: sim mode only.
#include <algorithm>
#include <cmath>
#include <limits>

#include "policies/policy.h"

namespace kvevict {
namespace {

class H2OPaperPolicy : public SimOnlyPolicy {
 public:
  using SimOnlyPolicy::SimOnlyPolicy;
  std::string name() const override { return "h2o-paper"; }
  std::string needs() const override { return "the unmasked softmax"; }

  // heavy = int(h*L), recent = int(r*L), as the paper sizes its masks.
  Budget layer_budget(int, const SequenceShape& shape) const override { return paper_split_budget(shape); }

  void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                      float* probs) const override {
    const Budget budget = layer_budget(layer, shape);
    const int heavy = budget.capacity - budget.recent, recent = budget.recent;
    // Heads are independent: they run on all threads, each head's arithmetic unchanged.
#pragma omp parallel for schedule(static)
    for (int h = 0; h < shape.n_q_heads; ++h)
      simulate_head(T, heavy, recent, logits + static_cast<size_t>(h) * T * T, probs + static_cast<size_t>(h) * T * T);
  }

 private:
  static void simulate_head(int T, int heavy, int recent, const float* L, float* P) {
    std::vector<float> p(T), acc(T, 0.0f);
    std::vector<char> keep(T), heavy_mask(T);
    std::vector<int> candidates;
    for (int i = 0; i < T; ++i) {
      const float* row = L + static_cast<size_t>(i) * T;
      std::fill(keep.begin(), keep.begin() + i + 1, 0);
      if (i < heavy) {
        std::fill(keep.begin(), keep.begin() + i + 1, 1);
        row_softmax(row, i, nullptr, p.data());
        for (int j = 0; j <= i; ++j) acc[j] += p[j];  // rows < hb, keys < hb
      } else if (heavy > 0) {
        // Keys with positive acc are the previous row's heavy set plus its own key.
        candidates.clear();
        for (int j = 0; j < i; ++j)
          if (acc[j] > 0) candidates.push_back(j);
        std::fill(heavy_mask.begin(), heavy_mask.begin() + i + 1, 0);
        mark_top(candidates, std::min<int>(heavy - 1, candidates.size()), acc, heavy_mask);
        heavy_mask[i] = 1;
        row_softmax(row, i, nullptr, p.data());
        for (int j = 0; j <= i; ++j) {
          acc[j] = heavy_mask[j] ? acc[j] + p[j] : 0.0f;
          keep[j] = heavy_mask[j];
        }
        for (int j = i + 1; j < T; ++j) acc[j] = 0.0f;
      }
      for (int j = std::max(0, i - recent); j <= i; ++j) keep[j] = 1;
      row_softmax(row, i, keep.data(), P + static_cast<size_t>(i) * T);
    }
  }

  // Marks the k candidates with the highest acc (ties: the lower index). Only the set
  // matters, and the order is total, so no sort is needed; in the steady state all but
  // one candidate stay, which is a scan for the one that goes (the lowest acc, the
  // higher index among equals).
  static void mark_top(std::vector<int>& candidates, int k, const std::vector<float>& acc,
                       std::vector<char>& mask) {
    const int n = static_cast<int>(candidates.size());
    if (k == n - 1 && n > 0) {
      int dropped = candidates[0];
      for (int c : candidates)
        if (acc[c] <= acc[dropped]) dropped = c;  // candidates ascend: the last of equals
      for (int c : candidates) mask[c] = 1;
      mask[dropped] = 0;
      return;
    }
    if (k < n)
      std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(),
                       [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
    for (int c = 0; c < k; ++c) mask[candidates[c]] = 1;
  }
};

}  // namespace

std::unique_ptr<Policy> make_h2o_paper_policy(const PolicyOptions& o) {
  return std::make_unique<H2OPaperPolicy>(o);
}

}  // namespace kvevict
