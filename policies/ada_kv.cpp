#include "policies/ada_kv.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/common/errors.h"
#include "policies/scored_slots.h"
#include "policies/wrapper_policy.h"

namespace kvevict {
namespace {

struct AdaCandidate {
  int tier;  // 2: a sink or recent slot, 1: within the head's safeguard, 0: the rest
  float score;
  int position, head, slot;
};

// Higher tier first, then higher score, then the more recent position, then the lower
// head: a total order, so the kept set does not depend on the sort.
bool ada_ranks_before(const AdaCandidate& a, const AdaCandidate& b) {
  if (a.tier != b.tier) return a.tier > b.tier;
  if (a.score != b.score) return a.score > b.score;
  if (a.position != b.position) return a.position > b.position;
  return a.head < b.head;
}

}  // namespace

void ada_allocate(const std::vector<const HeadSlots*>& heads, const std::vector<std::vector<float>>& scores,
                  const Budget& budget, int safeguard, int layer_capacity, std::vector<std::vector<int>>* kept) {
  const int H = static_cast<int>(heads.size());
  std::vector<AdaCandidate> candidates;
  for (int h = 0; h < H; ++h) {
    const HeadSlots& head = *heads[h];
    const int n = head.size();
    int n_sink = 0;
    while (n_sink < n && head.positions[n_sink] < budget.sink) ++n_sink;
    const int n_recent = std::min(budget.recent, n - n_sink);
    const size_t first = candidates.size();
    for (int s = 0; s < n; ++s) {
      const bool window = s < n_sink || s >= n - n_recent;
      // A NaN score ranks below every number.
      const float score = std::isnan(scores[h][s]) ? -std::numeric_limits<float>::infinity() : scores[h][s];
      candidates.push_back({window ? 2 : 0, score, head.positions[s], h, s});
    }
    // The safeguard: the head's best slots, its windows included, up to `safeguard`.
    auto begin = candidates.begin() + first;
    std::sort(begin, candidates.end(), ada_ranks_before);
    for (int i = 0; i < std::min(safeguard, n); ++i) begin[i].tier = std::max(begin[i].tier, 1);
  }
  const int count = std::min<int>(layer_capacity, static_cast<int>(candidates.size()));
  std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end(), ada_ranks_before);
  kept->assign(H, {});
  for (int i = 0; i < count; ++i) (*kept)[candidates[i].head].push_back(candidates[i].slot);
  for (auto& slots : *kept) std::sort(slots.begin(), slots.end());
}

namespace {

// One layer's decision across its heads. The driver runs the heads in lockstep, so every
// head has observed the step's query before the first one compresses; that first call
// decides for all heads, and each head then takes its own part.
class AdaLayer {
 public:
  AdaLayer(const ScoredPolicy& inner, Budget budget, int n_heads, double safeguard)
      : inner_(inner), budget_(budget), heads_(n_heads, nullptr), kept_(n_heads), pending_(n_heads, 0) {
    guard_ = static_cast<int>(safeguard * budget.capacity);
  }
  void attach(int kv_head, const HeadSlots* slots) { heads_[kv_head] = slots; }

  // The slots head `kv_head` keeps at this step (ascending); false when it keeps all.
  bool take(int kv_head, std::vector<int>* keep) {
    if (!pending_[kv_head]) decide();
    pending_[kv_head] = 0;
    if (static_cast<int>(kept_[kv_head].size()) == heads_[kv_head]->size()) return false;
    *keep = kept_[kv_head];
    return true;
  }

 private:
  void decide() {
    const int H = static_cast<int>(heads_.size());
    std::fill(pending_.begin(), pending_.end(), 1);
    int total = 0;
    for (const HeadSlots* head : heads_) total += head->size();
    // Every head has just taken the same query's key.
    const int newest = heads_[0]->positions.empty() ? 0 : heads_[0]->positions.back();
    const int layer_capacity = budget_.capacity_after(newest) * H;
    const bool compresses = budget_.compresses_after(newest);
    for (auto& kept : kept_) kept.clear();
    if (budget_.unlimited || !compresses || total <= layer_capacity) {
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < heads_[h]->size(); ++s) kept_[h].push_back(s);
      return;
    }
    scores_.resize(H);
    for (int h = 0; h < H; ++h) {
      scores_[h].resize(heads_[h]->size());
      inner_.score(*heads_[h], scores_[h].data());
    }
    ada_allocate(heads_, scores_, budget_, guard_, layer_capacity, &kept_);
  }

  const ScoredPolicy& inner_;
  Budget budget_;
  int guard_ = 0;
  std::vector<const HeadSlots*> heads_;
  std::vector<std::vector<int>> kept_;
  std::vector<char> pending_;
  std::vector<std::vector<float>> scores_;  // [head][slot]: the inner policy's
};

// One KV head: its slots and the inner policy's per-slot state; the layer decides.
class AdaHeadState : public LayerState {
 public:
  AdaHeadState(const ScoredPolicy& inner, int layer, int kv_head, const SequenceShape& shape, GroupReduce reduce,
               std::shared_ptr<AdaLayer> decision)
      : head_(inner, layer, kv_head, shape, reduce), kv_head_(kv_head), decision_(std::move(decision)) {
    decision_->attach(kv_head, &head_.slots);
  }

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto copy = std::make_unique<AdaHeadState>(*this);
    copy->decision_ = copies.copy_of(decision_);
    copy->decision_->attach(kv_head_, &copy->head_.slots);
    return copy;
  }

  void append(int position, const NewToken& token) override { head_.append(position, token); }
  void merge(int position, const NewToken& token) override { head_.merge(position, token); }
  void observe(const float* probs) override { head_.observe(probs); }

  bool compress(std::vector<int>* keep) override {
    if (!decision_->take(kv_head_, &kept_)) return false;
    head_.slots.gather(kept_);
    if (keep) *keep = kept_;
    return true;
  }

  const std::vector<int>& positions() const override { return head_.slots.positions; }

 private:
  ScoredSlots head_;
  int kv_head_;
  std::shared_ptr<AdaLayer> decision_;
  std::vector<int> kept_;
};

class AdaKVPolicy : public WrapperPolicy<RealisablePolicy> {
 public:
  AdaKVPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options)
      : WrapperPolicy(std::move(inner), scored, options, kAdaPrefix, kAdaSafeguard) {}

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    LayerStates states;
    states.lockstep = true;  // one decision across the layer's heads
    auto decision = std::make_shared<AdaLayer>(scored_, layer_budget(layer, shape), shape.n_kv_heads,
                                               options_.params.real(kAdaSafeguard));
    const GroupReduce reduce = parse_group_reduce(options_.params.text(kGroupReduce));
    for (int h = 0; h < shape.n_kv_heads; ++h)
      states.heads.push_back(
          std::make_unique<AdaHeadState>(scored_, layer, h, shape, reduce, decision));
    return states;
  }
};

}  // namespace

std::unique_ptr<Policy> make_ada_kv(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = wrapped_scored_policy(*inner, kAdaPrefix);
  return std::make_unique<AdaKVPolicy>(std::move(inner), scored, options);
}

}  // namespace kvevict
