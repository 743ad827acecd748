// PyramidKV: SnapKV's scores with per-layer budgets decreasing linearly from the
// bottom layer to the top (beta 20: the top layer gets base/beta heavy slots, the
// bottom 2*base - base/beta), so the average over layers stays at the budget.
#include "harness/errors.h"
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
    const int smallest = static_cast<int>(base / options_.pyramid_beta);
    const int largest = 2 * base - smallest;
    const int step = (largest - smallest) / (shape.n_layers - 1);
    b.capacity = largest - layer * step + b.recent + b.sink;
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
