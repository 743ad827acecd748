// LagKV (Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which
// Tokens Are Important", arXiv 2504.04704; kvpress's LagKVPress with cross_scoring off):
// query-free. A token matters when its key and value stand out against the tokens that
// come after it (the lag).
//
// At each compression, over the slots the KV head holds (oldest first):
//   - the n_sink sink slots (positions < n_sink) score +inf;
//   - the m other slots split, from the oldest, into chunks of L = lag_size slots. With
//     fewer than 2L of them no chunk has a lag, and a slot scores its position (the
//     newest stay: a sliding window, as kvpress);
//   - otherwise chunk j (j = 0 .. c-2, c = m / L full chunks) is lagged by chunk j+1. For
//     X = K and V, each token's vector is normalised channel by channel by the lag's
//     range, x' = (x - min) / (max - min) (a channel of zero range gives 0), and
//     s_X = softmax over the chunk's L tokens of std(x') (over the head_dim channels,
//     unbiased, as torch.std); the token's score is its rank within the chunk of
//     (s_K + s_V) / 2, divided by L (the lowest 0; equal values rank the older lower),
//     so each lagged chunk loses its least distinctive tokens at the same pace;
//   - the last chunk with the remainder (L to 2L-1 slots: it has no lag yet) scores 2,
//     above every rank: it acts as the recent window.
// Decode mode (and sim mode, which drives the same states): the chunks are counted over
// the slots held at that compression, so their boundaries move as slots are evicted; a
// chunk is re-scored against whatever its lag holds then, as kvpress re-applies the press
// to the compressed cache. Each slot keeps its key and value (post-RoPE key, as cached);
// sums in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "policies/policy.h"

namespace kvevict {
namespace {
const ParamSpec kLagSize = ParamSpec::integer("lag_size", 128, "lagkv: tokens per lag chunk").at_least(2);

class LagKVPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "lagkv"; }
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce, &kSink, &kLagSize}; }
  double default_heavy_share() const override { return 1.0; }  // the unlagged chunk is the recent window
  int sink_tokens() const override { return sinks_; }
  TokenVectors token_vectors() const override { return TokenVectors::KeysAndValues; }
  // Each slot keeps its key, then its value.
  int channels(int head_dim) const override { return 2 * head_dim; }
  void on_append(HeadSlots& head, float* slot, int, const NewToken& token) const override {
    const int d = head.channels / 2;
    std::copy(token.key, token.key + d, slot);
    std::copy(token.value, token.value + d, slot + d);
  }

  void score(const HeadSlots& head, float* out) const override {
    const int n = head.size(), L = lag_;
    int first = 0;  // the first slot after the sinks
    while (first < n && head.positions[first] < sinks_) out[first++] = std::numeric_limits<float>::infinity();
    const int m = n - first;
    if (m < 2 * L) {
      for (int s = first; s < n; ++s) out[s] = static_cast<float>(head.positions[s]);
      return;
    }
    const int chunks = m / L, tail = first + (chunks - 1) * L;
    std::vector<double> combined(L);
    std::vector<int> order(L);
    for (int j = 0; j + 1 < chunks; ++j) {
      const int start = first + j * L;
      std::fill(combined.begin(), combined.end(), 0.0);
      for (int part = 0; part < 2; ++part) add_lag_scores(head, start, part, &combined);
      // Each token's rank in the chunk (kvpress's argsort of argsort), a total order.
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return combined[a] != combined[b] ? combined[a] < combined[b] : a < b; });
      for (int rank = 0; rank < L; ++rank) out[start + order[rank]] = static_cast<float>(rank) / static_cast<float>(L);
    }
    for (int s = tail; s < n; ++s) out[s] = 2.0f;
  }

 private:
  // Adds half of softmax(std(x')) of part (0: keys, 1: values) over the chunk of L slots
  // from `start`, lagged by the L slots after it.
  void add_lag_scores(const HeadSlots& head, int start, int part, std::vector<double>* combined) const {
    const int L = lag_, d = head.channels / 2;
    auto vector = [&](int s) { return head.values.data() + static_cast<size_t>(s) * head.channels + part * d; };
    std::vector<double> lo(d, std::numeric_limits<double>::infinity()), hi(d, -lo[0]), spread(L), x(d);
    for (int s = start + L; s < start + 2 * L; ++s)
      for (int c = 0; c < d; ++c) {
        lo[c] = std::min<double>(lo[c], vector(s)[c]);
        hi[c] = std::max<double>(hi[c], vector(s)[c]);
      }
    for (int t = 0; t < L; ++t) {
      double mean = 0;
      for (int c = 0; c < d; ++c) {
        x[c] = hi[c] > lo[c] ? (vector(start + t)[c] - lo[c]) / (hi[c] - lo[c]) : 0.0;
        mean += x[c];
      }
      mean /= d;
      double squares = 0;
      for (int c = 0; c < d; ++c) squares += (x[c] - mean) * (x[c] - mean);
      spread[t] = std::sqrt(squares / std::max(1, d - 1));
    }
    const double top = *std::max_element(spread.begin(), spread.end());
    double sum = 0;
    for (double& e : spread) sum += (e = std::exp(e - top));
    for (int t = 0; t < L; ++t) (*combined)[t] += spread[t] / sum / 2;
  }

  const int sinks_ = static_cast<int>(options_.params.integer(kSink));
  const int lag_ = static_cast<int>(options_.params.integer(kLagSize));
};
}  // namespace

std::unique_ptr<Policy> make_lagkv_policy(const PolicyOptions& o) { return std::make_unique<LagKVPolicy>(o); }
}  // namespace kvevict
