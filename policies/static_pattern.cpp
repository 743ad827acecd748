#include "policies/static_pattern.h"

#include <algorithm>
#include <memory>

#include "harness/common/errors.h"

namespace kvevict {

int pattern_max_kept(const StaticPattern& pattern, int length) {
  // Both patterns attend the most keys at the end of a period (or at the last query).
  const int period = std::max(1, pattern.period());
  int best = 0;
  for (int i = period - 1; i < length; i += period) best = std::max(best, pattern.attended(i) - 1);
  if (length > 0) best = std::max(best, pattern.attended(length - 1) - 1);
  return best;
}

namespace {

// One layer of a static pattern, optionally with heavy hitters chosen by a scored
// policy (scorer may be null: the pattern alone).
class PatternLayerState : public LayerState {
 public:
  PatternLayerState(std::shared_ptr<const StaticPattern> pattern, const ScoredPolicy* scorer, int heavy,
                    int layer, const SequenceShape& shape, const std::string& group_reduce)
      : pattern_(std::move(pattern)), scorer_(scorer), heavy_capacity_(std::max(0, heavy)), shape_(shape),
        channels_(scorer ? scorer->channels() : 0), use_max_(group_reduce == "max"),
        heads_(shape.n_kv_heads), heavy_(shape.n_kv_heads) {
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      heads_[h].layer = layer;
      heads_[h].kv_head = h;
    }
  }

  void append(int position, const float* key_norms) override {
    last_position_ = position;
    for (auto& head : heads_) {
      head.positions.push_back(position);
      head.values.resize(head.values.size() + channels_, 0.0f);
      heavy_[head.kv_head].push_back(0);
      if (scorer_)
        scorer_->on_append(head, head.values.data() + head.values.size() - channels_, position,
                           key_norms ? key_norms[head.kv_head] : 0.0f);
    }
  }

  bool visible_slots(int kv_head, int query_position, std::vector<char>* visible) const override {
    if (query_position < shape_.prefill_len) return false;  // the prefill attends everything
    const auto& positions = heads_[kv_head].positions;
    const auto& heavy = heavy_[kv_head];
    visible->resize(positions.size());
    for (size_t s = 0; s < positions.size(); ++s)
      (*visible)[s] = positions[s] == query_position || heavy[s] || pattern_->attends(query_position, positions[s]);
    return true;
  }

  void observe(const float* probs) override {
    const int n = size(), group = shape_.group();
    for (auto& head : heads_) {
      if (scorer_) {
        aggregated_.assign(n, 0.0f);
        for (int j = 0; j < group; ++j) {
          const float* row = probs + static_cast<size_t>(head.kv_head * group + j) * n;
          for (int s = 0; s < n; ++s)
            aggregated_[s] = use_max_ ? std::max(aggregated_[s], row[s]) : aggregated_[s] + row[s];
        }
        if (!use_max_)
          for (int s = 0; s < n; ++s) aggregated_[s] /= group;
        scorer_->on_observe(head, aggregated_.data());
      }
      head.steps++;
    }
  }

  // After query i: heavy hitters for query i+1 are the best-scoring slots the pattern
  // does not attend at i+1; every other slot that no later query attends is dropped.
  bool compress(std::vector<std::vector<int>>* keep) override {
    const int i = last_position_, next = i + 1;
    bool evicted = false;
    std::vector<std::vector<int>> kept_slots(heads_.size());
    std::vector<float> shared_scores;
    if (scorer_ && heavy_capacity_ > 0 && scorer_->shared_across_heads()) {
      // One decision per layer (heads hold the same slots then): average the scores.
      const int n = size();
      shared_scores.assign(n, 0.0f);
      std::vector<float> head_scores(n);
      for (auto& head : heads_) {
        scorer_->score(head, head_scores.data());
        for (int s = 0; s < n; ++s) shared_scores[s] += head_scores[s] / heads_.size();
      }
    }
    for (size_t h = 0; h < heads_.size(); ++h) {
      HeadSlots& head = heads_[h];
      const int n = static_cast<int>(head.positions.size());
      std::vector<char> heavy(n, 0);
      if (scorer_ && heavy_capacity_ > 0) {
        if (shared_scores.empty()) {
          scores_.resize(n);
          scorer_->score(head, scores_.data());
        } else {
          scores_ = shared_scores;
        }
        candidates_.clear();
        for (int s = 0; s < n; ++s)
          if (!pattern_->attends(next, head.positions[s])) candidates_.push_back(s);
        const int k = std::min<int>(heavy_capacity_, candidates_.size());
        std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), [&](int a, int b) {
          if (scores_[a] != scores_[b]) return scores_[a] > scores_[b];
          return a > b;  // ties keep the more recent token
        });
        for (int c = 0; c < k; ++c) heavy[candidates_[c]] = 1;
      }
      auto& kept = kept_slots[h];
      for (int s = 0; s < n; ++s)
        if (heavy[s] || pattern_->needed_later(i, head.positions[s])) kept.push_back(s);
      if (static_cast<int>(kept.size()) < n) evicted = true;
      std::vector<char> kept_heavy;
      for (int s : kept) kept_heavy.push_back(heavy[s]);
      heavy_[h].swap(kept_heavy);
      if (static_cast<int>(kept.size()) < n) gather(head, kept);
    }
    if (evicted) {
      for (size_t h = 1; h < kept_slots.size(); ++h)
        if (kept_slots[h].size() != kept_slots[0].size())
          throw Error("internal: pattern cache heads hold different token counts");
      if (keep) *keep = kept_slots;
    }
    return evicted;
  }

  int size() const override { return static_cast<int>(heads_[0].positions.size()); }
  const std::vector<int>& positions(int kv_head) const override { return heads_[kv_head].positions; }

 private:
  void gather(HeadSlots& head, const std::vector<int>& kept) {
    std::vector<int> positions(kept.size());
    std::vector<float> values(kept.size() * channels_);
    for (size_t k = 0; k < kept.size(); ++k) {
      positions[k] = head.positions[kept[k]];
      std::copy_n(head.values.begin() + static_cast<size_t>(kept[k]) * channels_, channels_,
                  values.begin() + k * channels_);
    }
    head.positions.swap(positions);
    head.values.swap(values);
  }

  std::shared_ptr<const StaticPattern> pattern_;
  const ScoredPolicy* scorer_;
  int heavy_capacity_;
  SequenceShape shape_;
  int channels_;
  bool use_max_;
  std::vector<HeadSlots> heads_;
  std::vector<std::vector<char>> heavy_;  // per head, per slot: a heavy hitter for the next query
  int last_position_ = -1;
  std::vector<float> aggregated_, scores_;
  std::vector<int> candidates_;
};

// Largest number of keys the cache holds after any of the first `length` steps.
int max_cached(const StaticPattern& pattern, int length) {
  int best = 0;
  for (int i = 0; i < length; ++i) best = std::max(best, pattern.cached_after(i));
  return best;
}

}  // namespace

std::unique_ptr<StaticPattern> PatternPolicy::pattern_for(int budget_tokens, int length) const {
  // The count falls with the period up to about sqrt(length), then rises again: the
  // first period that fits is the best fit on the short-period branch.
  int smallest = min_period(), smallest_kept = -1;
  for (int period = min_period(); period <= std::max(min_period(), length); ++period) {
    const int kept = pattern_max_kept(*make_pattern(period), length);
    if (kept <= budget_tokens) return make_pattern(period);
    if (smallest_kept < 0 || kept < smallest_kept) {
      smallest = period;
      smallest_kept = kept;
    }
  }
  return make_pattern(smallest);
}

std::unique_ptr<StaticPattern> PatternPolicy::resolve(const SequenceShape& shape) const {
  if (options_.stride > 0) return make_pattern(options_.stride);
  return pattern_for(total_budget(shape), shape.length);
}

void PatternPolicy::validate(const SequenceShape& shape) const {
  if (options_.stride == 0 || options_.stride < -1)
    throw Error("--stride " + std::to_string(options_.stride) + " must be a positive period");
  if (options_.stride > 0 && !options_.budget.is_set()) {
    make_pattern(options_.stride);  // checks --summary against the period
    return;  // the pattern alone: no budget needed
  }
  Policy::validate(shape);
}

Budget PatternPolicy::layer_budget(int, const SequenceShape& shape) const {
  // The physical cache: what later queries still attend.
  Budget budget;
  budget.capacity = max_cached(*resolve(shape), shape.length);
  return budget;
}

std::unique_ptr<LayerState> PatternPolicy::make_layer_state(int layer, const SequenceShape& shape) const {
  return std::make_unique<PatternLayerState>(std::shared_ptr<const StaticPattern>(resolve(shape)), nullptr, 0, layer,
                                             shape, options_.group_reduce);
}

// ---------------------------------------------------------------------------------
namespace {

class ComposedPolicy : public Policy {
 public:
  ComposedPolicy(std::unique_ptr<Policy> scored, std::unique_ptr<Policy> pattern)
      : Policy(scored->options()), scored_holder_(std::move(scored)), pattern_holder_(std::move(pattern)),
        scored_(dynamic_cast<const ScoredPolicy*>(scored_holder_.get())),
        pattern_(dynamic_cast<const PatternPolicy*>(pattern_holder_.get())) {}

  std::string name() const override { return scored_->name() + "+" + pattern_->name(); }
  double default_heavy_share() const override { return scored_->default_heavy_share(); }

  // The scored policy's split of its own budget: heavy hitters, and the rest (its
  // recent window and sinks) for the pattern.
  struct Parts {
    std::shared_ptr<const StaticPattern> pattern;
    int heavy = 0;
  };
  Parts parts(int layer, const SequenceShape& shape) const {
    const Budget b = scored_->layer_budget(layer, shape);
    Parts p;
    p.pattern = options_.stride > 0 ? pattern_->make_pattern(options_.stride)
                                    : pattern_->pattern_for(b.recent + b.sink, shape.length);
    p.heavy = std::max(0, b.capacity - pattern_max_kept(*p.pattern, shape.length));
    return p;
  }

  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    const Parts p = parts(layer, shape);
    Budget budget;
    budget.capacity = std::min(shape.length, max_cached(*p.pattern, shape.length) + p.heavy);
    return budget;
  }

  void validate(const SequenceShape& shape) const override {
    scored_->validate(shape);
    if (options_.stride == 0 || options_.stride < -1)
      throw Error("--stride " + std::to_string(options_.stride) + " must be a positive period");
  }

  std::unique_ptr<LayerState> make_layer_state(int layer, const SequenceShape& shape) const override {
    const Parts p = parts(layer, shape);
    return std::make_unique<PatternLayerState>(p.pattern, scored_, p.heavy, layer, shape, options_.group_reduce);
  }

 private:
  std::unique_ptr<Policy> scored_holder_, pattern_holder_;
  const ScoredPolicy* scored_;
  const PatternPolicy* pattern_;
};

}  // namespace

std::unique_ptr<Policy> compose_with_pattern(std::unique_ptr<Policy> scored, std::unique_ptr<Policy> pattern) {
  const std::string composed = scored->name() + "+" + pattern->name();
  if (!dynamic_cast<const PatternPolicy*>(pattern.get()))
    throw Error("policy " + composed + ": \"" + pattern->name() + "\" is not a static pattern (use sparse-strided or sparse-fixed after the +)");
  if (!dynamic_cast<const ScoredPolicy*>(scored.get()) || !scored->realisable() || scored->keeps_everything())
    throw Error("policy " + composed + ": \"" + scored->name() + "\" is not a scored eviction policy to combine with a pattern");
  return std::make_unique<ComposedPolicy>(std::move(scored), std::move(pattern));
}

}  // namespace kvevict
