// The paper repository's later LLaMA variant: per head, one heavy-hitter set for the
// whole sequence, the top-hb keys by the column sums of the causal softmax over ALL
// rows (future queries included), plus each row's recent band. Non-causal: a row's
// mask depends on queries after it. Sim mode only.
#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {
namespace {

class H2OGlobalPolicy : public Policy {
 public:
  using Policy::Policy;
  std::string name() const override { return "h2o-global"; }
  bool realisable() const override { return false; }
  bool causal() const override { return false; }
  std::unique_ptr<LayerState> make_layer_state(int, const SequenceShape&) const override {
    throw Error("policy h2o-global scores keys by attention from future queries (non-causal): "
                "it runs in --mode sim only");
  }

  // heavy = int(h*L), recent = int(r*L), as the paper sizes its masks.
  Budget layer_budget(int, const SequenceShape& shape) const override { return paper_split_budget(shape); }

  void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                      float* probs) const override {
    const Budget budget = layer_budget(layer, shape);
    const int heavy = budget.capacity - budget.recent, recent = budget.recent;
    std::vector<float> column(T), p(T);
    std::vector<char> is_heavy(T);
    std::vector<int> order(T);
    for (int h = 0; h < shape.n_q_heads; ++h) {
      const float* L = logits + static_cast<size_t>(h) * T * T;
      float* P = probs + static_cast<size_t>(h) * T * T;
      std::fill(column.begin(), column.end(), 0.0f);
      for (int i = 0; i < T; ++i) {
        row_softmax(L + static_cast<size_t>(i) * T, i, nullptr, p.data());
        for (int j = 0; j <= i; ++j) column[j] += p[j];
      }
      for (int j = 0; j < T; ++j) order[j] = j;
      const int k = std::min(heavy, T);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
        return column[a] != column[b] ? column[a] > column[b] : a < b;
      });
      std::fill(is_heavy.begin(), is_heavy.end(), 0);
      for (int c = 0; c < k; ++c) is_heavy[order[c]] = 1;
      std::vector<char> keep(T);
      for (int i = 0; i < T; ++i) {
        for (int j = 0; j <= i; ++j) keep[j] = is_heavy[j] || j >= i - recent;
        row_softmax(L + static_cast<size_t>(i) * T, i, keep.data(), P + static_cast<size_t>(i) * T);
      }
    }
  }

};

}  // namespace

std::unique_ptr<Policy> make_h2o_global_policy(const PolicyOptions& o) {
  return std::make_unique<H2OGlobalPolicy>(o);
}

}  // namespace kvevict
