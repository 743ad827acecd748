#include "policies/cam.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

uint64_t cam_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double cam_merge_draw(uint64_t seed, int layer, int kv_head, int position) {
  const uint64_t h = cam_mix(seed ^ cam_mix((uint64_t(layer) << 40) ^ (uint64_t(kv_head) << 32) ^ uint32_t(position)));
  return static_cast<double>(h >> 11) / static_cast<double>(1ULL << 53);
}

namespace {

struct CamSettings {
  int layer = 0, kv_head = 0, head_dim = 0, group = 1, merge_budget = 32;
  uint64_t seed = 0;
};

// One KV head: the token policy's state, with each slot's value and cumulative attention beside it.
class CamHeadState : public LayerState {
 public:
  CamHeadState(std::unique_ptr<LayerState> inner, const CamSettings& settings)
      : inner_(std::move(inner)), settings_(settings) {}

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto inner = inner_->clone(copies);
    if (!inner) return nullptr;
    auto copy = std::make_unique<CamHeadState>(std::move(inner), settings_);
    copy->values_ = values_;
    copy->attention_ = attention_;
    copy->positions_ = positions_;
    copy->rewrites_ = rewrites_;
    copy->pending_ = pending_;
    return copy;
  }

  void append(int position, const NewToken& token) override {
    inner_->append(position, token);
    values_.insert(values_.end(), token.value, token.value + settings_.head_dim);
    attention_.push_back(0.0);
    positions_.push_back(position);
  }
  void merge(int, const NewToken&) override {
    throw Error("internal: CaM's states do not follow DMC's merges (check_dmc_policy refuses them)");
  }
  bool visible(int query_position, std::vector<char>* visible) const override {
    return inner_->visible(query_position, visible);
  }
  void observe(const float* probs) override {
    const int n = static_cast<int>(attention_.size()), g = settings_.group;
    for (int s = 0; s < n; ++s) {
      double sum = 0;
      for (int j = 0; j < g; ++j) sum += probs[static_cast<size_t>(j) * n + s];
      attention_[s] += sum / g;
    }
    inner_->observe(probs);
  }

  bool compress(std::vector<int>* keep) override {
    if (!inner_->compress(&kept_)) return false;
    merge_evicted();
    if (keep) *keep = kept_;
    return true;
  }

  // The token policy's own rewrites (think+POLICY's pruning) come with the merges.
  bool take_rewrites(SlotRewrites* out) override {
    const bool inner = inner_->take_rewrites(out);
    if (!pending_) return inner;
    out->value_slots.insert(out->value_slots.end(), rewrites_.value_slots.begin(), rewrites_.value_slots.end());
    out->value_deltas.insert(out->value_deltas.end(), rewrites_.value_deltas.begin(), rewrites_.value_deltas.end());
    rewrites_.clear();
    pending_ = false;
    return true;
  }

  const std::vector<int>& positions() const override { return inner_->positions(); }

 private:
  // The merges of this compression (kept_: the old slot indices kept, ascending), then
  // the slots' values and attention gathered, the merges added to the kept values.
  void merge_evicted() {
    const int d = settings_.head_dim, n = static_cast<int>(attention_.size()), kept = static_cast<int>(kept_.size());
    rewrites_.clear();
    int next = 0;  // the first kept slot after the evicted one
    for (int i = 0; i < n; ++i) {
      while (next < kept && kept_[next] < i) ++next;
      if (next < kept && kept_[next] == i) continue;  // kept
      const int m = std::min(settings_.merge_budget, kept - next);
      if (m == 0) continue;
      double window = 0;
      for (int t = next; t < next + m; ++t) window += attention_[kept_[t]];
      window /= m;
      const double ratio = window > 0 ? attention_[i] / window : (attention_[i] > 0 ? 1.0 : 0.0);
      const double p = std::clamp(ratio, 0.0, 1.0);
      if (!(cam_merge_draw(settings_.seed, settings_.layer, settings_.kv_head, positions_[i]) < p)) continue;
      for (int t = next; t < next + m; ++t) {
        rewrites_.value_slots.push_back(t);
        for (int c = 0; c < d; ++c) rewrites_.value_deltas.push_back(values_[static_cast<size_t>(i) * d + c] / m);
      }
    }
    std::vector<float> values(static_cast<size_t>(kept) * d);
    std::vector<double> attention(kept);
    std::vector<int> positions(kept);
    for (int k = 0; k < kept; ++k) {
      std::copy_n(values_.begin() + static_cast<size_t>(kept_[k]) * d, d, values.begin() + static_cast<size_t>(k) * d);
      attention[k] = attention_[kept_[k]];
      positions[k] = positions_[kept_[k]];
    }
    values_.swap(values);
    attention_.swap(attention);
    positions_.swap(positions);
    // Each kept value's additions summed in float32 in order, then added once: what the cache adds.
    std::vector<float> sums(static_cast<size_t>(kept) * d, 0.0f);
    std::vector<char> merged(kept, 0);
    for (size_t r = 0; r < rewrites_.value_slots.size(); ++r) {
      const int slot = rewrites_.value_slots[r];
      merged[slot] = 1;
      for (int c = 0; c < d; ++c) sums[static_cast<size_t>(slot) * d + c] += rewrites_.value_deltas[r * d + c];
    }
    for (int k = 0; k < kept; ++k)
      if (merged[k])
        for (int c = 0; c < d; ++c) values_[static_cast<size_t>(k) * d + c] += sums[static_cast<size_t>(k) * d + c];
    pending_ = !rewrites_.value_slots.empty();
  }

  std::unique_ptr<LayerState> inner_;
  CamSettings settings_;
  std::vector<float> values_;      // [slots][head_dim]
  std::vector<double> attention_;  // [slots]: A_j
  std::vector<int> positions_;     // [slots], as the token policy's
  SlotRewrites rewrites_;
  bool pending_ = false;
  std::vector<int> kept_;
};

// The token policy's name, budget and checks, with its evictions merged.
class CamPolicy : public RealisablePolicy {
 public:
  CamPolicy(std::unique_ptr<Policy> inner, const PolicyOptions& options)
      : RealisablePolicy(options), inner_(std::move(inner)) {
    if (!inner_->realisable() || inner_->keeps_everything())
      throw Error("policy " + name() + ": \"" + inner_->name() + "\" is not a realisable policy that evicts (e.g. " +
                  kCamPrefix + "h2o)");
  }

  std::string name() const override { return kCamPrefix + inner_->name(); }
  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = inner_->parameters();
    params.push_back(&kMergeBudget);
    params.push_back(&kMergeSeed);
    return params;
  }
  bool splits_budget() const override { return inner_->splits_budget(); }
  double default_heavy_share() const override { return inner_->default_heavy_share(); }
  int sink_tokens() const override { return inner_->sink_tokens(); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override { return inner_->layer_budget(layer, shape); }
  bool states_agree(const SequenceShape& a, const SequenceShape& b) const override { return inner_->states_agree(a, b); }
  void validate(const SequenceShape& shape) const override { inner_->validate(shape); }
  TokenVectors token_vectors() const override {
    return std::max(TokenVectors::KeysAndValues, inner_->as_realisable()->token_vectors());
  }
  int prefill_block() const override { return inner_->as_realisable()->prefill_block(); }
  bool rewrites_slots() const override { return true; }
  Prepass prepass() const override { return inner_->prepass(); }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    if (shape.head_dim < 1) throw Error("internal: policy " + name() + " needs the model's head_dim");
    LayerStates states = inner_->as_realisable()->make_layer_states(layer, shape);
    for (size_t h = 0; h < states.heads.size(); ++h) {
      CamSettings settings;
      settings.layer = layer;
      settings.kv_head = static_cast<int>(h);
      settings.head_dim = shape.head_dim;
      settings.group = shape.group();
      settings.merge_budget = static_cast<int>(options_.params.integer(kMergeBudget));
      settings.seed = options_.params.seed(kMergeSeed);
      states.heads[h] = std::make_unique<CamHeadState>(std::move(states.heads[h]), settings);
    }
    return states;
  }

 private:
  std::unique_ptr<Policy> inner_;
};

}  // namespace

std::unique_ptr<Policy> make_cam(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  return std::make_unique<CamPolicy>(std::move(inner), options);
}

}  // namespace kvevict
