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

// One KV head of a static pattern, optionally with heavy hitters chosen by a scored
// policy (scorer may be null: the pattern alone). With a scorer whose decision is shared
// by the layer's heads, the scores come from the layer's SharedScores.
class PatternHeadState : public LayerState {
 public:
  PatternHeadState(std::shared_ptr<const StaticPattern> pattern, const ScoredPolicy* scorer, int heavy, int layer,
                   int kv_head, const SequenceShape& shape, GroupReduce reduce, std::shared_ptr<SharedScores> shared)
      : pattern_(std::move(pattern)), scorer_(scorer), heavy_capacity_(std::max(0, heavy)),
        prefill_len_(shape.prefill_len), group_(shape.group()), reduce_(reduce), shared_(std::move(shared)) {
    slots_.channels = scorer ? scorer->channels(shape.head_dim) : 0;
    slots_.layer = layer;
    slots_.kv_head = kv_head;
    if (shared_) shared_->attach(kv_head, &slots_);
  }

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto copy = std::make_unique<PatternHeadState>(*this);  // the pattern itself never changes
    copy->shared_ = copies.copy_of(shared_);
    if (copy->shared_) copy->shared_->attach(slots_.kv_head, &copy->slots_);
    return copy;
  }

  void append(int position, const NewToken& token) override {
    last_position_ = position;
    float* values = slots_.append(position);
    heavy_.push_back(0);
    if (scorer_) scorer_->on_append(slots_, values, position, token);
  }

  void merge(int position, const NewToken& token) override {
    last_position_ = position;
    float* values = slots_.renew_last(position);
    if (scorer_) scorer_->on_append(slots_, values, position, token);
  }

  bool visible(int query_position, std::vector<char>* visible) const override {
    if (query_position < prefill_len_) return false;  // the prefill attends everything
    const auto& positions = slots_.positions;
    visible->resize(positions.size());
    for (size_t s = 0; s < positions.size(); ++s)
      (*visible)[s] = positions[s] == query_position || heavy_[s] || pattern_->attends(query_position, positions[s]);
    return true;
  }

  void observe(const float* probs) override {
    if (scorer_) {
      reduce_group(probs, group_, slots_.size(), reduce_, &aggregated_);
      scorer_->on_observe(slots_, aggregated_.data());
    }
    slots_.steps++;
  }

  // After query i: heavy hitters for query i+1 are the best-scoring slots the pattern
  // does not attend at i+1; every other slot that no later query attends is dropped.
  bool compress(std::vector<int>* keep) override {
    const int i = last_position_, next = i + 1, n = slots_.size();
    std::vector<char> heavy(n, 0);
    if (scorer_ && heavy_capacity_ > 0) {
      if (shared_) {
        scores_ = shared_->scores();
      } else {
        scores_.resize(n);
        scorer_->score(slots_, scores_.data());
      }
      candidates_.clear();
      for (int s = 0; s < n; ++s)
        if (!pattern_->attends(next, slots_.positions[s])) candidates_.push_back(s);
      const int k = std::min<int>(heavy_capacity_, candidates_.size());
      std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), [&](int a, int b) {
        if (scores_[a] != scores_[b]) return scores_[a] > scores_[b];
        return a > b;  // ties keep the more recent token
      });
      for (int c = 0; c < k; ++c) heavy[candidates_[c]] = 1;
    }
    kept_.clear();
    for (int s = 0; s < n; ++s)
      if (heavy[s] || pattern_->needed_later(i, slots_.positions[s])) kept_.push_back(s);
    heavy_.clear();
    for (int s : kept_) heavy_.push_back(heavy[s]);
    if (static_cast<int>(kept_.size()) == n) return false;
    slots_.gather(kept_);
    if (keep) *keep = kept_;
    return true;
  }

  const std::vector<int>& positions() const override { return slots_.positions; }

 private:
  std::shared_ptr<const StaticPattern> pattern_;
  const ScoredPolicy* scorer_;
  int heavy_capacity_, prefill_len_, group_;
  GroupReduce reduce_;
  std::shared_ptr<SharedScores> shared_;
  HeadSlots slots_;
  std::vector<char> heavy_;  // per slot: a heavy hitter for the next query
  int last_position_ = -1;
  std::vector<float> aggregated_, scores_;
  std::vector<int> candidates_, kept_;
};

// A layer of pattern heads; heavy hitters from `scorer` (may be null).
LayerStates pattern_layer_states(std::shared_ptr<const StaticPattern> pattern, const ScoredPolicy* scorer, int heavy,
                                 int layer, const SequenceShape& shape, const std::string& group_reduce) {
  // A pattern decides what each query sees by its position, not by a budget to grow.
  if (shape.question_len > 0)
    throw Error("static patterns (sparse-strided, sparse-fixed and their compositions) have no budget to keep a "
                "question uncompressed; use --question aware");
  LayerStates states;
  states.lockstep = states.same_slots = scorer && heavy > 0 && scorer->shared_across_heads();
  auto shared = states.lockstep ? std::make_shared<SharedScores>(*scorer, shape.n_kv_heads) : nullptr;
  for (int h = 0; h < shape.n_kv_heads; ++h)
    states.heads.push_back(std::make_unique<PatternHeadState>(pattern, scorer, heavy, layer, h, shape,
                                                              parse_group_reduce(group_reduce), shared));
  return states;
}

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
  const int stride = static_cast<int>(options_.params.integer(kStride));
  if (stride > 0) return make_pattern(stride);
  return pattern_for(total_budget(shape), shape.length);
}

void PatternPolicy::validate(const SequenceShape& shape) const {
  const int stride = static_cast<int>(options_.params.integer(kStride));
  if (stride > 0 && !options_.budget.is_set()) {
    make_pattern(stride);  // checks --summary against the period
    return;  // the pattern alone: no budget needed
  }
  Policy::validate(shape);
}

bool PatternPolicy::states_agree(const SequenceShape& a, const SequenceShape& b) const {
  // A period chosen from the budget is chosen for the length.
  return a.length == b.length && Policy::states_agree(a, b);
}

Budget PatternPolicy::layer_budget(int, const SequenceShape& shape) const {
  // The physical cache: what later queries still attend.
  Budget budget;
  budget.capacity = max_cached(*resolve(shape), shape.length);
  return budget;
}

LayerStates PatternPolicy::make_layer_states(int layer, const SequenceShape& shape) const {
  return pattern_layer_states(std::shared_ptr<const StaticPattern>(resolve(shape)), nullptr, 0, layer, shape,
                              options_.params.text(kGroupReduce));
}

// ---------------------------------------------------------------------------------
namespace {

class ComposedPolicy : public RealisablePolicy {
 public:
  ComposedPolicy(std::unique_ptr<Policy> scored, std::unique_ptr<Policy> pattern)
      : RealisablePolicy(scored->options()), scored_holder_(std::move(scored)), pattern_holder_(std::move(pattern)),
        scored_(dynamic_cast<const ScoredPolicy*>(scored_holder_.get())),
        pattern_(dynamic_cast<const PatternPolicy*>(pattern_holder_.get())) {}

  std::string name() const override { return scored_->name() + "+" + pattern_->name(); }
  std::vector<const ParamSpec*> parameters() const override {
    auto params = scored_->parameters();
    for (const ParamSpec* p : pattern_->parameters())
      if (std::find(params.begin(), params.end(), p) == params.end()) params.push_back(p);
    return params;
  }
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
    const int stride = static_cast<int>(options_.params.integer(kStride));
    p.pattern = stride > 0 ? pattern_->make_pattern(stride) : pattern_->pattern_for(b.recent + b.sink, shape.length);
    p.heavy = std::max(0, b.capacity - pattern_max_kept(*p.pattern, shape.length));
    return p;
  }

  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    const Parts p = parts(layer, shape);
    Budget budget;
    budget.capacity = std::min(shape.length, max_cached(*p.pattern, shape.length) + p.heavy);
    return budget;
  }

  void validate(const SequenceShape& shape) const override { scored_->validate(shape); }
  TokenVectors token_vectors() const override { return scored_->token_vectors(); }
  Prepass prepass() const override { return scored_->prepass(); }
  // The pattern and the heavy share are sized to the length.
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override {
    return a.length == b.length && Policy::states_agree(a, b);
  }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    const Parts p = parts(layer, shape);
    return pattern_layer_states(p.pattern, scored_, p.heavy, layer, shape, options_.params.text(kGroupReduce));
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
