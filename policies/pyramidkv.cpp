// PyramidKV: SnapKV's scores with per-layer budgets decreasing linearly from the
// bottom layer to the top (beta 20: the top layer gets base/beta heavy slots, the
// bottom 2*base - base/beta), so the average over layers equals the budget.
#include <cmath>

#include "harness/common/errors.h"
#include "policies/snapkv.h"

namespace kvevict {
namespace {
class PyramidKVPolicy : public SnapKVPolicy {
 public:
  using SnapKVPolicy::SnapKVPolicy;
  std::string name() const override { return "pyramidkv"; }
  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    Budget b = Policy::layer_budget(layer, shape);
    const int base = b.capacity - b.recent - b.sink;
    if (shape.n_layers < 2 || base <= 0) return b;
    // The linear schedule in real numbers sums to exactly n_layers * base; layer l gets
    // the rounded cumulative sum's increment, so the integer budgets keep that sum (a
    // truncated integer step would overshoot: 39/30/21/12/3 for base 20 over 5 layers).
    const double smallest = base / options_.pyramid_beta;
    const double largest = 2.0 * base - smallest;
    const double step = (largest - smallest) / (shape.n_layers - 1);
    auto cumulative = [&](int layers) {  // sum of the first `layers` layer budgets
      return std::llround(layers * largest - step * layers * (layers - 1) / 2.0);
    };
    b.capacity = static_cast<int>(cumulative(layer + 1) - cumulative(layer)) + b.recent + b.sink;
    return b;
  }
};
}  // namespace

std::unique_ptr<Policy> make_pyramidkv_policy(const PolicyOptions& o) {
  if (o.window < 1) throw Error("pyramidkv: --window must be at least 1");
  if (o.pyramid_beta < 1) throw Error("pyramidkv: beta must be at least 1");
  return std::make_unique<PyramidKVPolicy>(o);
}
}  // namespace kvevict
