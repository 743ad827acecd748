#include "policies/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "harness/common/errors.h"
#include "policies/slot_selection.h"

namespace kvevict {

const ParamSpec kGroupReduce = ParamSpec::choice(
    "group_reduce", {"mean", "max"}, "GQA aggregation over a KV head's query heads");

int Policy::total_budget(const SequenceShape& shape) const {
  const BudgetSpec& b = options_.budget;
  if (b.heavy_ratio >= 0 || b.recent_ratio >= 0) {
    // The paper: int(ratio * T) for each part separately.
    return static_cast<int>(std::max(0.0, b.heavy_ratio) * shape.length) +
           static_cast<int>(std::max(0.0, b.recent_ratio) * shape.length);
  }
  if (b.tokens > 0) return b.tokens;
  if (b.ratio > 0) return static_cast<int>(b.ratio * shape.length);
  throw Error("policy " + name() + " needs a budget (--budget, --budget-tokens or --heavy-ratio/--recent-ratio)");
}

Budget Policy::layer_budget(int /*layer*/, const SequenceShape& shape) const {
  Budget budget;
  if (keeps_everything()) {
    budget.unlimited = true;
    return budget;
  }
  const BudgetSpec& b = options_.budget;
  budget.sink = sink_tokens();
  if (b.heavy_ratio >= 0 || b.recent_ratio >= 0) {
    int heavy = static_cast<int>(std::max(0.0, b.heavy_ratio) * shape.length);
    budget.recent = static_cast<int>(std::max(0.0, b.recent_ratio) * shape.length);
    budget.capacity = heavy + budget.recent + budget.sink;
    return budget;
  }
  int total = total_budget(shape);
  // A ratio budget on a short request can round below the sink count: the sinks then
  // take the whole budget (an absolute budget that small is rejected by validate()).
  budget.sink = std::min(budget.sink, total);
  double share = b.heavy_share >= 0 ? b.heavy_share : default_heavy_share();
  int rest = std::max(0, total - budget.sink);
  int heavy = static_cast<int>(rest * share);
  budget.recent = rest - heavy;
  budget.capacity = total;
  return budget;
}

namespace {

// The double nearest to x's 12-significant-digit decimal: products such as 0.7*0.2
// (0.13999999999999999) become the 0.14 a user would have typed, so int(h*L) agrees
// with the paper's int(0.14*L).
double snap_decimal(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.12g", x);
  return std::strtod(text, nullptr);
}

}  // namespace

std::pair<double, double> Policy::heavy_recent_ratios() const {
  const BudgetSpec& b = options_.budget;
  if (b.heavy_ratio >= 0 || b.recent_ratio >= 0)
    return {std::max(0.0, b.heavy_ratio), std::max(0.0, b.recent_ratio)};
  if (b.ratio > 0) {
    const double share = b.heavy_share >= 0 ? b.heavy_share : default_heavy_share();
    return {snap_decimal(share * b.ratio), snap_decimal((1 - share) * b.ratio)};
  }
  return {-1, -1};
}

Budget Policy::paper_split_budget(const SequenceShape& shape) const {
  const BudgetSpec& b = options_.budget;
  if (b.tokens > 0 && b.heavy_ratio < 0 && b.recent_ratio < 0) return Policy::layer_budget(0, shape);
  const auto [heavy_ratio, recent_ratio] = heavy_recent_ratios();
  if (heavy_ratio < 0) return Policy::layer_budget(0, shape);  // no budget: total_budget() says so
  Budget budget;
  const int heavy = static_cast<int>(heavy_ratio * shape.length);
  budget.recent = static_cast<int>(recent_ratio * shape.length);
  budget.capacity = heavy + budget.recent;
  return budget;
}

void Policy::validate(const SequenceShape& shape) const {
  if (keeps_everything()) return;
  const BudgetSpec& b = options_.budget;
  if (b.ratio != -1 && (b.ratio <= 0 || b.ratio > 1))
    throw Error("budget " + std::to_string(b.ratio) + " is outside (0, 1]");
  if (b.tokens != -1 && b.tokens <= 0)
    throw Error("budget of " + std::to_string(b.tokens) + " tokens must be positive");
  if (!b.is_set())
    throw Error("policy " + name() + " needs a budget (--budget, --budget-tokens or --heavy-ratio/--recent-ratio)");
  if (b.heavy_share != -1 && (b.heavy_share < 0 || b.heavy_share > 1))
    throw Error("heavy share " + std::to_string(b.heavy_share) + " is outside [0, 1]");
  if (b.heavy_ratio > 1 || b.recent_ratio > 1 || (b.heavy_ratio >= 0 && b.recent_ratio >= 0 &&
                                                   b.heavy_ratio + b.recent_ratio > 1))
    throw Error("heavy ratio + recent ratio must lie in (0, 1]");
  if (b.tokens > shape.length)
    throw Error("budget of " + std::to_string(b.tokens) + " tokens is larger than the sequence (" +
                std::to_string(shape.length) + " tokens)");
  // A ratio budget may round to 0 tokens on a short request (int(ratio * T), as the
  // paper): the cache then keeps nothing between steps and each query sees itself only.
  int total = total_budget(shape);
  if (b.tokens > 0 && total < sink_tokens())
    throw Error("budget of " + std::to_string(total) + " tokens is smaller than the " +
                std::to_string(sink_tokens()) + " sink tokens of " + name());
}

void row_softmax(const float* row, int i, const char* keep, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j <= i; ++j)
    if (!keep || keep[j]) m = std::max(m, row[j]);
  float sum = 0;
  for (int j = 0; j <= i; ++j) sum += (out[j] = (!keep || keep[j]) ? std::exp(row[j] - m) : 0.0f);
  for (int j = 0; j <= i; ++j) out[j] /= sum;
}

// ---------------------------------------------------------------------------------
namespace {

class ScoredLayerState : public LayerState {
 public:
  ScoredLayerState(const ScoredPolicy& policy, int layer, const SequenceShape& shape)
      : policy_(policy), shape_(shape), budget_(policy.layer_budget(layer, shape)),
        channels_(policy.channels()), use_max_(policy.options().params.text(kGroupReduce) == "max"),
        heads_(shape.n_kv_heads), scratch_(shape.n_kv_heads) {
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      heads_[h].layer = layer;
      heads_[h].kv_head = h;
    }
  }

  void append(int position, const float* key_norms) override {
    for (auto& head : heads_) append_one(head, position, key_norms ? key_norms[head.kv_head] : 0.0f);
  }

  void observe(const float* probs) override {
    const size_t n = static_cast<size_t>(size()), group = static_cast<size_t>(shape_.group());
    for (auto& head : heads_) observe_one(head, probs + head.kv_head * group * n, scratch_[head.kv_head]);
  }

  bool independent_heads() const override { return !policy_.shared_across_heads(); }
  void append_head(int kv_head, int position, float key_norm) override {
    append_one(heads_[kv_head], position, key_norm);
  }
  void observe_head(int kv_head, const float* probs) override {
    observe_one(heads_[kv_head], probs, scratch_[kv_head]);
  }
  void compress_head(int kv_head) override {
    HeadSlots& head = heads_[kv_head];
    if (budget_.unlimited || static_cast<int>(head.positions.size()) <= budget_.capacity) return;
    compress_head(head, scratch_[kv_head], nullptr);
  }

  bool compress(std::vector<std::vector<int>>* keep) override {
    const int n = size();
    if (budget_.unlimited || n <= budget_.capacity) return false;
    if (keep) keep->assign(heads_.size(), {});
    if (policy_.shared_across_heads()) {
      // One decision per layer: average the heads' scores, select once.
      scores_.assign(n, 0.0f);
      head_scores_.resize(n);
      for (auto& head : heads_) {
        policy_.score(head, head_scores_.data());
        for (int s = 0; s < n; ++s) scores_[s] += head_scores_[s] / heads_.size();
      }
      const int evicted = decide(heads_[0].positions, scores_.data(), scratch_[0]);
      for (size_t h = 0; h < heads_.size(); ++h) apply(heads_[h], evicted, scratch_[0].kept, keep ? &(*keep)[h] : nullptr);
      return true;
    }
    // Heads decide independently: with enough state per step (windowed scores) they
    // share the threads, each with its own scratch.
    const int n_heads = static_cast<int>(heads_.size());
    constexpr long kParallelStateFloats = 16384;
    const bool parallel = static_cast<long>(n) * channels_ * n_heads >= kParallelStateFloats;
#pragma omp parallel for schedule(static) if (parallel)
    for (int h = 0; h < n_heads; ++h) compress_head(heads_[h], scratch_[h], keep ? &(*keep)[h] : nullptr);
    return true;
  }

  int size() const override { return static_cast<int>(heads_[0].positions.size()); }
  const std::vector<int>& positions(int kv_head) const override {
    return heads_[kv_head].positions;
  }

 private:
  struct Scratch {
    std::vector<float> scores, aggregated;
    std::vector<int> kept, candidates;
  };

  void append_one(HeadSlots& head, int position, float key_norm) const {
    head.positions.push_back(position);
    head.values.resize(head.values.size() + channels_, 0.0f);
    float* slot = head.values.data() + head.values.size() - channels_;
    policy_.on_append(head, slot, position, key_norm);
  }

  // probs: [group][slots], the head's query heads.
  void observe_one(HeadSlots& head, const float* probs, Scratch& scratch) const {
    const int n = static_cast<int>(head.positions.size()), group = shape_.group();
    std::vector<float>& aggregated = scratch.aggregated;
    aggregated.assign(n, 0.0f);
    const bool use_max = use_max_;
    for (int j = 0; j < group; ++j) {
      const float* row = probs + static_cast<size_t>(j) * n;
      for (int s = 0; s < n; ++s)
        aggregated[s] = use_max ? std::max(aggregated[s], row[s]) : aggregated[s] + row[s];
    }
    if (!use_max)
      for (int s = 0; s < n; ++s) aggregated[s] /= group;
    policy_.on_observe(head, aggregated.data());
    head.steps++;
  }

  void compress_head(HeadSlots& head, Scratch& scratch, std::vector<int>* keep) const {
    scratch.scores.resize(head.positions.size());
    policy_.score(head, scratch.scores.data());
    apply(head, decide(head.positions, scratch.scores.data(), scratch), scratch.kept, keep);
  }

  // The steady state evicts one slot per step: a scan (its index is returned). Otherwise
  // the general selection fills scratch.kept and -1 is returned.
  int decide(const std::vector<int>& positions, const float* scores, Scratch& scratch) const {
    const int evicted = single_evicted_slot(positions, scores, budget_);
    if (evicted < 0) select_kept_slots(positions, scores, budget_, &scratch.kept, &scratch.candidates);
    return evicted;
  }

  // Carries out decide()'s answer on one head: an erase in place, or a gather of the kept
  // slots. keep (if not null) gets the kept slot indices, ascending.
  void apply(HeadSlots& head, int evicted, const std::vector<int>& kept, std::vector<int>* keep) const {
    const int n = static_cast<int>(head.positions.size());
    if (evicted >= 0) {
      erase_slot(head, evicted);
      if (keep) *keep = all_but(n, evicted);
    } else {
      gather(head, kept);
      if (keep) *keep = kept;
    }
  }

  void erase_slot(HeadSlots& head, int slot) const {
    head.positions.erase(head.positions.begin() + slot);
    const auto first = head.values.begin() + static_cast<ptrdiff_t>(slot) * channels_;
    head.values.erase(first, first + channels_);
  }

  static std::vector<int> all_but(int n, int slot) {
    std::vector<int> kept;
    kept.reserve(n - 1);
    for (int s = 0; s < n; ++s)
      if (s != slot) kept.push_back(s);
    return kept;
  }

  void gather(HeadSlots& head, const std::vector<int>& kept) const {
    std::vector<int> positions(kept.size());
    std::vector<float> values(kept.size() * channels_);
    for (size_t i = 0; i < kept.size(); ++i) {
      positions[i] = head.positions[kept[i]];
      std::copy_n(head.values.begin() + static_cast<size_t>(kept[i]) * channels_, channels_,
                  values.begin() + i * channels_);
    }
    head.positions.swap(positions);
    head.values.swap(values);
  }

  const ScoredPolicy& policy_;
  SequenceShape shape_;
  Budget budget_;
  int channels_;
  bool use_max_;
  std::vector<HeadSlots> heads_;
  std::vector<float> scores_, head_scores_;
  std::vector<Scratch> scratch_;  // per head (the first also serves a decision shared by all heads)
};

}  // namespace

std::unique_ptr<LayerState> ScoredPolicy::make_layer_state(int layer,
                                                           const SequenceShape& shape) const {
  return std::make_unique<ScoredLayerState>(*this, layer, shape);
}

}  // namespace kvevict
