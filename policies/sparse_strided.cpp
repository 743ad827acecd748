// Sparse Transformer's strided pattern (Child et al. 2019) with stride l: query i
// attends keys j <= i with i - j < l or (i - j) mod l = 0. Every key is attended again
// l steps later, so the cache can never drop one: attention is sparse, memory is full
// (see static_pattern.h).
#include "harness/common/errors.h"
#include "policies/static_pattern.h"

namespace kvevict {
namespace {

class StridedPattern : public StaticPattern {
 public:
  explicit StridedPattern(int stride) : l_(stride) {
    if (l_ < 1) throw Error("sparse-strided: --stride " + std::to_string(l_) + " must be at least 1");
  }
  bool attends(int i, int j) const override { return i - j < l_ || (i - j) % l_ == 0; }
  bool needed_later(int, int) const override { return true; }
  int attended(int i) const override { return std::min(i + 1, l_) + i / l_; }
  int cached_after(int i) const override { return i + 1; }
  int period() const override { return l_; }

 private:
  int l_;
};

class SparseStridedPolicy : public PatternPolicy {
 public:
  using PatternPolicy::PatternPolicy;
  std::string name() const override { return "sparse-strided"; }
  std::unique_ptr<StaticPattern> make_pattern(int period) const override {
    return std::make_unique<StridedPattern>(period);
  }
};

}  // namespace

std::unique_ptr<Policy> make_sparse_strided_policy(const PolicyOptions& o) {
  return std::make_unique<SparseStridedPolicy>(o);
}
}  // namespace kvevict
