// Sparse Transformer's fixed pattern (Child et al. 2019) with block l and c summary
// positions: query i attends keys j <= i with floor(j/l) = floor(i/l) (its own block)
// or j mod l >= l - c (the last c keys of every block). A finished block's other keys
// are never attended again, so the cache drops them: memory follows the pattern.
#include <algorithm>

#include "harness/common/errors.h"
#include "policies/static_pattern.h"

namespace kvevict {
namespace {

class FixedPattern : public StaticPattern {
 public:
  FixedPattern(int block, int summary) : l_(block), c_(summary) {
    if (l_ < 1) throw Error("sparse-fixed: --stride (the block length) " + std::to_string(l_) + " must be at least 1");
    if (c_ < 0 || c_ > l_)
      throw Error("sparse-fixed: --summary " + std::to_string(c_) + " must lie in [0, block length " +
                  std::to_string(l_) + "]");
  }
  bool attends(int i, int j) const override { return j / l_ == i / l_ || j % l_ >= l_ - c_; }
  bool needed_later(int i, int j) const override { return j % l_ >= l_ - c_ || j / l_ == (i + 1) / l_; }
  int attended(int i) const override { return i % l_ + 1 + c_ * (i / l_); }
  int cached_after(int i) const override {
    const int done = i + 1, in_block = done % l_;  // keys 0..i; those in the next query's block
    const int summaries = c_ * (done / l_) + std::max(0, in_block - (l_ - c_));
    return summaries + std::min(in_block, l_ - c_);
  }
  int period() const override { return l_; }

 private:
  int l_, c_;
};

class SparseFixedPolicy : public PatternPolicy {
 public:
  using PatternPolicy::PatternPolicy;
  std::string name() const override { return "sparse-fixed"; }
  std::unique_ptr<StaticPattern> make_pattern(int period) const override {
    return std::make_unique<FixedPattern>(period, options_.summary);
  }
  int min_period() const override { return std::max(1, options_.summary); }
};

}  // namespace

std::unique_ptr<Policy> make_sparse_fixed_policy(const PolicyOptions& o) {
  return std::make_unique<SparseFixedPolicy>(o);
}
}  // namespace kvevict
