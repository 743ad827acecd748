// Static sparse attention patterns (Sparse Transformer, Child et al. 2019) as cache
// policies, and their composition with any scored policy ("h2o+sparse-strided").
//
// A pattern says which keys query i attends. It is not a monotone keep-set: the strided
// pattern attends key j at i = j, j+1, .., j+l-1 and again at every i = j + k*l, so a
// key it skips now comes back later. A real cache therefore holds every key a LATER
// query still attends (the union), and each query's attention is masked to its own
// pattern (LayerState::visible). Sim mode masks the same way, so decode == sim.
// "Kept" for these policies means what a query attends; the physical cache is reported
// by the usual KV statistics: sparse-fixed drops each finished block but its summary
// keys (memory follows the pattern), sparse-strided can never drop a key (memory is the
// full cache: strided attention saves compute, not memory).
#pragma once
#include <memory>
#include <string>

#include "policies/policy.h"

namespace kvevict {

class StaticPattern {
 public:
  virtual ~StaticPattern() = default;
  // True when query i attends key j (0 <= j <= i).
  virtual bool attends(int i, int j) const = 0;
  // True when some query after i attends key j <= i: the cache must still hold it.
  virtual bool needed_later(int i, int j) const = 0;
  // Keys query i attends, itself included.
  virtual int attended(int i) const = 0;
  // Keys the cache holds after step i (those needed_later).
  virtual int cached_after(int i) const = 0;
  // The period parameter (stride or block length), for reports.
  virtual int period() const = 0;
};

// Most keys any query 0..length-1 attends besides itself.
int pattern_max_kept(const StaticPattern& pattern, int length);

inline const ParamSpec kStride = ParamSpec::integer(
    "stride", -1, "sparse-strided: stride l; sparse-fixed: block length l (-1: chosen from the budget)")
                                      .at_least(1)
                                      .or_value(-1);

// A policy whose keep rule is a static pattern. Subclasses make the pattern for a given
// period; the period comes from --stride, or from a kept-token budget (see
// pattern_for).
class PatternPolicy : public RealisablePolicy {
 public:
  using RealisablePolicy::RealisablePolicy;
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce, &kStride}; }
  virtual std::unique_ptr<StaticPattern> make_pattern(int period) const = 0;
  virtual int min_period() const { return 1; }
  // The shortest period whose largest per-query kept count (itself excluded) over
  // `length` queries fits `budget_tokens`. The count is U-shaped in the period (short
  // periods attend many distant keys, long ones approach a local window); the shortest
  // fitting period keeps the pattern's long-range character. When none fits, the
  // period with the smallest count (about sqrt(length)). --stride overrides it.
  std::unique_ptr<StaticPattern> pattern_for(int budget_tokens, int length) const;

  double default_heavy_share() const override { return 0.0; }
  void validate(const SequenceShape& shape) const override;
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override;
  Budget layer_budget(int layer, const SequenceShape& shape) const override;
  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override;

 private:
  std::unique_ptr<StaticPattern> resolve(const SequenceShape& shape) const;
};

// "scored+pattern": the pattern takes the place of the scored policy's recent window
// (and sinks): it is sized to that part of the budget, and the rest of the same total
// budget holds heavy hitters chosen by the scored policy's own score among the keys the
// pattern does not attend. Throws kvevict::Error when the parts are of the wrong kind.
std::unique_ptr<Policy> compose_with_pattern(std::unique_ptr<Policy> scored, std::unique_ptr<Policy> pattern);

}  // namespace kvevict
