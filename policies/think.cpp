#include "policies/think.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict {

std::vector<int> think_pruned_channels(const std::vector<double>& query_squares, int queries,
                                       const std::vector<float>& keys, int slots, int head_dim, double ratio) {
  const int pruned = static_cast<int>(head_dim * ratio);
  std::vector<double> score(head_dim, 0.0);
  for (int s = 0; s < slots; ++s)
    for (int c = 0; c < head_dim; ++c) {
      const double k = keys[static_cast<size_t>(s) * head_dim + c];
      score[c] += k * k;
    }
  for (int c = 0; c < head_dim; ++c)
    score[c] = (query_squares[c] / std::max(1, queries)) * (score[c] / std::max(1, slots));
  std::vector<int> order(head_dim);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] < score[b]; });
  order.resize(pruned);
  std::sort(order.begin(), order.end());
  return order;
}

namespace {

// What each head of a layer needs to know of the prefill and the pruning.
struct ThinkSettings {
  int prefill_last = -1;  // the position whose compression prunes
  int window = 32;
  int head_dim = 0;
  int group = 1;
  double ratio = 0.5;
};

// One KV head: the token policy's state, with each slot's key (until the pruning) and the
// window's squared queries beside it.
class ThinkHeadState : public LayerState {
 public:
  ThinkHeadState(std::unique_ptr<LayerState> inner, const ThinkSettings& settings)
      : inner_(std::move(inner)), settings_(settings), query_squares_(settings.head_dim, 0.0) {}

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto inner = inner_->clone(copies);
    if (!inner) return nullptr;
    auto copy = std::make_unique<ThinkHeadState>(std::move(inner), settings_);
    copy->keys_ = keys_;
    copy->query_squares_ = query_squares_;
    copy->queries_ = queries_;
    copy->pruned_ = pruned_;
    copy->pending_ = pending_;
    copy->kept_ = kept_;
    return copy;
  }

  void append(int position, const NewToken& token) override {
    inner_->append(position, token);
    if (pruned_) return;
    const int d = settings_.head_dim;
    keys_.insert(keys_.end(), token.key, token.key + d);
    if (position > settings_.prefill_last - settings_.window && position <= settings_.prefill_last) {
      for (int j = 0; j < settings_.group; ++j)
        for (int c = 0; c < d; ++c) {
          const double q = token.queries[j * d + c];
          query_squares_[c] += q * q;
        }
      queries_ += settings_.group;
    }
  }

  void merge(int, const NewToken&) override {
    throw Error("internal: ThinK's states do not follow DMC's merges (check_dmc_policy refuses them)");
  }
  bool visible(int query_position, std::vector<char>* visible) const override {
    return inner_->visible(query_position, visible);
  }
  void observe(const float* probs) override { inner_->observe(probs); }

  bool compress(std::vector<int>* keep) override {
    // The query just observed (the token policy may evict its own slot).
    const bool prefill_ends = !pruned_ && !positions().empty() && positions().back() == settings_.prefill_last;
    const bool evicted = inner_->compress(&kept_);
    if (evicted) {
      if (!pruned_) {
        // The keys follow the slots the token policy kept.
        const int d = settings_.head_dim;
        std::vector<float> kept_keys(kept_.size() * d);
        for (size_t k = 0; k < kept_.size(); ++k)
          std::copy_n(keys_.begin() + static_cast<size_t>(kept_[k]) * d, d, kept_keys.begin() + k * d);
        keys_.swap(kept_keys);
      }
      if (keep) *keep = kept_;
    }
    if (prefill_ends) prune();
    return evicted;
  }

  // The token policy's own rewrites (cam+POLICY's merges) come with the pruning.
  bool take_rewrites(SlotRewrites* out) override {
    const bool inner = inner_->take_rewrites(out);
    if (!pending_) return inner;
    if (!out->key_slots.empty()) throw Error("internal: two prunings of the same keys' channels at once");
    out->key_slots = std::move(rewrites_.key_slots);
    out->zeroed_channels = std::move(rewrites_.zeroed_channels);
    rewrites_.clear();
    pending_ = false;
    return true;
  }

  const std::vector<int>& positions() const override { return inner_->positions(); }

 private:
  void prune() {
    pruned_ = true;
    const int n = size();
    rewrites_.zeroed_channels =
        think_pruned_channels(query_squares_, queries_, keys_, n, settings_.head_dim, settings_.ratio);
    keys_.clear();
    keys_.shrink_to_fit();
    if (rewrites_.zeroed_channels.empty()) return;
    rewrites_.key_slots.resize(n);
    std::iota(rewrites_.key_slots.begin(), rewrites_.key_slots.end(), 0);
    pending_ = true;
  }

  std::unique_ptr<LayerState> inner_;
  ThinkSettings settings_;
  std::vector<float> keys_;            // [slots][head_dim] until the pruning
  std::vector<double> query_squares_;  // [head_dim]: the window's q^2, summed over queries and group
  int queries_ = 0;                    // query vectors summed there
  bool pruned_ = false;
  bool pending_ = false;  // rewrites_ waits for take_rewrites
  SlotRewrites rewrites_;
  std::vector<int> kept_;
};

class ThinkPolicy;
const ThinkPolicy* as_think(const Policy& policy);

// The token policy's name, budget and checks, with the key channels pruned on top.
class ThinkPolicy : public RealisablePolicy {
 public:
  ThinkPolicy(std::unique_ptr<Policy> inner, const PolicyOptions& options)
      : RealisablePolicy(options), inner_(std::move(inner)) {
    const std::string name = kThinkPrefix + inner_->name();
    if (!inner_->realisable() || inner_->keeps_everything())
      throw Error("policy " + name + ": \"" + inner_->name() + "\" is not a realisable policy that evicts (e.g. " +
                  kThinkPrefix + "snapkv)");
    if (as_think(*inner_)) throw Error("policy " + name + " prunes key channels twice");
  }

  std::string name() const override { return kThinkPrefix + inner_->name(); }
  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = inner_->parameters();
    params.push_back(&kKeyChannelRatio);
    params.push_back(&kThinkWindow);
    return params;
  }
  bool splits_budget() const override { return inner_->splits_budget(); }
  double default_heavy_share() const override { return inner_->default_heavy_share(); }
  int sink_tokens() const override { return inner_->sink_tokens(); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override { return inner_->layer_budget(layer, shape); }
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override {
    return a.prefill_len == b.prefill_len && inner_->states_agree(a, b);
  }
  void validate(const SequenceShape& shape) const override {
    inner_->validate(shape);
    if (shape.prefill_len < 1)
      throw Error("policy " + name() + " prunes key channels at the end of the prefill, and this run has none "
                  "(the stream protocol)");
  }
  TokenVectors token_vectors() const override { return TokenVectors::KeysValuesAndQueries; }
  int prefill_block() const override { return inner_->as_realisable()->prefill_block(); }
  // At ratio 0 no channel is pruned: nothing is rewritten, and the token policy's own
  // passes run it (sim mode's block path, not the per-query one a rewrite needs).
  bool rewrites_slots() const override { return options_.params.real(kKeyChannelRatio) > 0; }
  Prepass prepass() const override { return inner_->prepass(); }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    if (shape.head_dim < 1) throw Error("internal: policy " + name() + " needs the model's head_dim");
    ThinkSettings settings;
    settings.prefill_last = shape.prefill_len - 1;
    settings.window = static_cast<int>(options_.params.integer(kThinkWindow));
    settings.head_dim = shape.head_dim;
    settings.group = shape.group();
    settings.ratio = options_.params.real(kKeyChannelRatio);
    LayerStates states = inner_->as_realisable()->make_layer_states(layer, shape);
    for (auto& head : states.heads) head = std::make_unique<ThinkHeadState>(std::move(head), settings);
    return states;
  }

 private:
  std::unique_ptr<Policy> inner_;
};

const ThinkPolicy* as_think(const Policy& policy) { return dynamic_cast<const ThinkPolicy*>(&policy); }

}  // namespace

std::unique_ptr<Policy> make_think(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  return std::make_unique<ThinkPolicy>(std::move(inner), options);
}

}  // namespace kvevict
