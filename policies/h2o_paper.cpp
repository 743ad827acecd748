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

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {
namespace {

class H2OPaperPolicy : public Policy {
 public:
  using Policy::Policy;
  std::string name() const override { return "h2o-paper"; }
  bool realisable() const override { return false; }
  std::unique_ptr<LayerState> make_layer_state(int, const SequenceShape&) const override {
    throw Error("policy h2o-paper accumulates the unmasked softmax, which a real cache does not "
                "have: it runs in --mode sim only");
  }

  // heavy = int(h*L), recent = int(r*L), as the paper sizes its masks.
  Budget layer_budget(int, const SequenceShape& shape) const override { return paper_split_budget(shape); }

  void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                      float* probs) const override {
    const Budget budget = layer_budget(layer, shape);
    const int heavy = budget.capacity - budget.recent, recent = budget.recent;
    std::vector<float> p(T), acc(T);
    std::vector<char> keep(T);
    std::vector<int> candidates;
    for (int h = 0; h < shape.n_q_heads; ++h) {
      const float* L = logits + static_cast<size_t>(h) * T * T;
      float* P = probs + static_cast<size_t>(h) * T * T;
      std::fill(acc.begin(), acc.end(), 0.0f);
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
          const int k = std::min<int>(heavy - 1, candidates.size());
          std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                            [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
          std::vector<char> heavy_mask(i + 1, 0);
          for (int c = 0; c < k; ++c) heavy_mask[candidates[c]] = 1;
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
  }

};

}  // namespace

std::unique_ptr<Policy> make_h2o_paper_policy(const PolicyOptions& o) {
  return std::make_unique<H2OPaperPolicy>(o);
}

}  // namespace kvevict
