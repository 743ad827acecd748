// Expected Attention (Devoto, Jeblick and Jégou 2025, "Expected Attention: KV Cache
// Compression by Estimating Attention from Future Queries Distribution", arXiv 2510.00636;
// kvpress's ExpectedAttentionPress). A key matters by the attention that the queries still
// to come are expected to pay it. Queries are taken as Gaussian, q ~ N(mu, Sigma), so the
// expected unnormalised attention of key k has the closed form of the Gaussian's
// moment-generating function,
//
//   E[exp(q.k / sqrt(d))] = exp(mu.k / sqrt(d) + k^T Sigma k / (2 d)),
//
// and RoPE enters as the rotation averaged over the next n_future_positions positions,
// Rbar = (1/F) sum_{t=T}^{T+F-1} R(t), applied to the pre-RoPE statistics:
// mu' = Rbar mu, Sigma' = Rbar Sigma Rbar^T (kvpress's approximation of the mean of
// R(t) Sigma R(t)^T). With d = head_dim, at each compression of a KV head after the query
// at position T - 1 (the newest slot's):
//   - mu_j and Sigma_j, for each query head j of the KV head's group: the mean and the
//     covariance (1/N, centred) of its pre-RoPE queries at positions >= n_sink (kvpress
//     drops the first n_sink hidden states), all of them, or the newest n_window;
//   - for each slot s at position >= n_sink, z_js = mu'_j.k_s / sqrt(d) +
//     k_s^T Sigma'_j k_s / (2d) (the second term only with use_covariance), and
//     a_js = softmax over those slots of z_js;
//   - score_s = mean_j a_js, then (score_s + epsilon) * |v_s| with use_vnorm;
//   - sink slots (positions < n_sink) score +inf: they stay (kvpress pads them with the
//     maximum + 1), as the budget's sink window keeps them too.
// The harness hands each token's queries after RoPE (NewToken::queries), as the model
// computed them at the token's position p; the pre-RoPE query is that one rotated back
// by -p (R(p)^-1 = R(-p)), with the model's own frequencies (SequenceShape::rope_inv_freq,
// rotate-half pairs (i, i + r/2) for i < r/2, dims from r on not rotated). A model
// without RoPE (OPT's learned positions) has no rotation: R is the identity. Keys are the
// post-RoPE keys the cache holds, as kvpress scores them. (Dynamic-NTK rope_scaling: the
// frequencies are those of a pass of the sequence's length, exact within the trained
// context; beyond it a decode step's rotation differs from them, and the rotated-back
// query is approximate.)
//
// ada+expected-attention is kvpress's AdaKVPress over this press: the same per-head
// scores, ranked across the layer's heads with each head's safeguard (policies/ada_kv.h).
//
// Decode mode (and sim mode, which drives the same states): every step after the prefill
// compresses, each time with the statistics of the queries so far and the future window
// starting after the newest position, so the prefill's compression is kvpress's prefill
// press and the steps after it re-score the cache they hold. Sums in double (the running
// sums of q and q q^T per query head, a window's oldest query taken back out as it
// leaves); the scores are then rounded to float. No recent window, as kvpress.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {
namespace {
const ParamSpec kFuturePositions = ParamSpec::integer(
    "n_future_positions", 512, "expected-attention: future positions the RoPE rotation is averaged over").at_least(1);
const ParamSpec kQueryWindow = ParamSpec::integer(
    "n_window", 0, "expected-attention: newest queries the statistics cover (0: every query after the sinks)")
    .at_least(0);
const ParamSpec kUseCovariance = ParamSpec::choice(
    "use_covariance", {"true", "false"}, "expected-attention: add the queries' covariance term k^T Sigma k / 2d");
const ParamSpec kUseValueNorm = ParamSpec::choice(
    "use_vnorm", {"true", "false"}, "expected-attention: scale each score by its value's L2 norm");
const ParamSpec kEpsilon = ParamSpec::real(
    "epsilon", 0.0, "expected-attention: added to each score before the value-norm scaling").at_least(0);

// A KV head's query statistics inside HeadSlots::head_state (doubles):
//   [0] group, [1] rotated pairs r/2, [2] queries in the sums (N), [3] queries seen
//   at positions >= n_sink; then the r/2 inverse frequencies, the sums of q [group][d],
//   the sums of q q^T [group][d][d] (with use_covariance), and a window's ring of its
//   queries [n_window][group][d].
struct QueryStats {
  static constexpr int kHeader = 4;
  QueryStats(const std::vector<double>& state, int head_dim, bool covariance, int window)
      : group(static_cast<int>(state[0])), pairs(static_cast<int>(state[1])), d(head_dim) {
    sums_at = kHeader + pairs;
    squares_at = sums_at + group * d;
    ring_at = squares_at + (covariance ? group * d * d : 0);
    size = ring_at + static_cast<size_t>(window) * group * d;
  }
  int group, pairs, d;
  size_t sums_at, squares_at, ring_at, size;
};

class ExpectedAttentionPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "expected-attention"; }
  std::vector<const ParamSpec*> parameters() const override {
    return {&kSink, &kFuturePositions, &kQueryWindow, &kUseCovariance, &kUseValueNorm, &kEpsilon};
  }
  double default_heavy_share() const override { return 1.0; }  // no recent window, as kvpress
  int sink_tokens() const override { return sinks_; }
  TokenVectors token_vectors() const override { return TokenVectors::KeysValuesAndQueries; }
  // Each slot keeps its key, then its value's L2 norm.
  int channels(int head_dim) const override { return head_dim + 1; }

  void on_create(HeadSlots& head, const SequenceShape& shape) const override {
    const int pairs = static_cast<int>(shape.rope_inv_freq.size());
    if (2 * pairs > shape.head_dim)
      throw Error("internal: policy expected-attention got " + std::to_string(pairs) + " RoPE frequencies for head_dim " +
                  std::to_string(shape.head_dim));
    head.head_state.assign(QueryStats::kHeader, 0.0);
    head.head_state[0] = shape.group();
    head.head_state[1] = pairs;
    head.head_state.insert(head.head_state.end(), shape.rope_inv_freq.begin(), shape.rope_inv_freq.end());
    head.head_state.resize(QueryStats(head.head_state, shape.head_dim, covariance_, window_).size, 0.0);
  }

  void on_append(HeadSlots& head, float* slot, int position, const NewToken& token) const override {
    const int d = head.channels - 1;
    std::copy(token.key, token.key + d, slot);
    double squares = 0;
    for (int c = 0; c < d; ++c) squares += static_cast<double>(token.value[c]) * token.value[c];
    slot[d] = static_cast<float>(std::sqrt(squares));
    if (position >= sinks_) add_queries(head, position, token.queries);
  }

  void score(const HeadSlots& head, float* out) const override {
    const int n = head.size(), d = head.channels - 1;
    const std::vector<double>& state = head.head_state;
    const QueryStats layout(state, d, covariance_, window_);
    const int g = layout.group, pairs = layout.pairs;
    const double count = state[2];
    // The averaged rotation over positions T .. T+F-1, per pair: [[C, -S], [S, C]].
    const double T = head.positions.back() + 1.0, F = static_cast<double>(future_);
    std::vector<double> C(pairs), S(pairs);
    for (int i = 0; i < pairs; ++i) averaged_rotation(state[QueryStats::kHeader + i], T, F, &C[i], &S[i]);
    auto rotate = [&](double* x, size_t stride) {  // x[c * stride], c = 0 .. d-1
      for (int i = 0; i < pairs; ++i) {
        const double a = x[i * stride], b = x[(i + pairs) * stride];
        x[i * stride] = C[i] * a - S[i] * b;
        x[(i + pairs) * stride] = S[i] * a + C[i] * b;
      }
    };
    int first = 0;  // sinks first: they are a prefix of the slots
    while (first < n && head.positions[first] < sinks_) out[first++] = std::numeric_limits<float>::infinity();
    std::vector<double> total(n, 0.0), z(n), mean(d), cov(static_cast<size_t>(d) * d), key(d);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int j = 0; j < g; ++j) {
      const double* sums = state.data() + layout.sums_at + static_cast<size_t>(j) * d;
      for (int c = 0; c < d; ++c) mean[c] = count > 0 ? sums[c] / count : 0.0;
      if (covariance_) {
        const double* squares = state.data() + layout.squares_at + static_cast<size_t>(j) * d * d;
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b)
            cov[a * d + b] = count > 0 ? squares[a * d + b] / count - mean[a] * mean[b] : 0.0;
        for (int b = 0; b < d; ++b) rotate(cov.data() + b, d);      // Rbar Sigma: each column
        for (int a = 0; a < d; ++a) rotate(cov.data() + a * d, 1);  // (Rbar Sigma) Rbar^T: each row
      }
      rotate(mean.data(), 1);
      double top = -std::numeric_limits<double>::infinity();
      for (int s = first; s < n; ++s) {
        const float* k = head.values.data() + static_cast<size_t>(s) * head.channels;
        for (int c = 0; c < d; ++c) key[c] = k[c];
        double logit = 0;
        for (int c = 0; c < d; ++c) logit += mean[c] * key[c];
        logit *= scale;
        if (covariance_) {
          double quadratic = 0;
          for (int a = 0; a < d; ++a) {
            double row = 0;
            for (int b = 0; b < d; ++b) row += cov[a * d + b] * key[b];
            quadratic += key[a] * row;
          }
          logit += quadratic / (2.0 * d);
        }
        z[s] = logit;
        top = std::max(top, logit);
      }
      double sum = 0;
      for (int s = first; s < n; ++s) sum += (z[s] = std::exp(z[s] - top));
      for (int s = first; s < n; ++s) total[s] += z[s] / sum;
    }
    for (int s = first; s < n; ++s) {
      double score = total[s] / g;
      if (vnorm_) score = (score + epsilon_) * head.values[static_cast<size_t>(s) * head.channels + d];
      out[s] = static_cast<float>(score);
    }
  }

 private:
  // The mean over t = T .. T+F-1 of cos(t w) and sin(t w), in closed form: the sum of
  // exp(i t w) is exp(i (T + (F-1)/2) w) sin(F w / 2) / sin(w / 2).
  static void averaged_rotation(double w, double T, double F, double* cos_mean, double* sin_mean) {
    const double half = std::sin(w / 2);
    const double ratio = half != 0 ? std::sin(F * w / 2) / half : F;
    const double middle = (T + (F - 1) / 2) * w;
    *cos_mean = ratio * std::cos(middle) / F;
    *sin_mean = ratio * std::sin(middle) / F;
  }

  // The group's queries at `position` ([group][d], after RoPE) rotated back to before
  // RoPE and added to the head's statistics (a window's oldest taken out).
  void add_queries(HeadSlots& head, int position, const float* queries) const {
    const int d = head.channels - 1;
    std::vector<double>& state = head.head_state;
    const QueryStats layout(state, d, covariance_, window_);
    const int g = layout.group, pairs = layout.pairs;
    const double seen = state[3];
    double* ring = window_ > 0 ? state.data() + layout.ring_at +
                                     static_cast<size_t>(static_cast<long long>(seen) % window_) * g * d
                               : nullptr;
    const bool leaving = window_ > 0 && seen >= window_;
    std::vector<double> q(d);
    for (int j = 0; j < g; ++j) {
      const float* post = queries + static_cast<size_t>(j) * d;
      for (int c = 0; c < d; ++c) q[c] = post[c];
      for (int i = 0; i < pairs; ++i) {  // R(-p): the angle -p w
        const double angle = position * state[QueryStats::kHeader + i], c = std::cos(angle), s = std::sin(angle);
        const double a = q[i], b = q[i + pairs];
        q[i] = c * a + s * b;
        q[i + pairs] = -s * a + c * b;
      }
      double* old = ring ? ring + static_cast<size_t>(j) * d : nullptr;
      update(state.data() + layout.sums_at + static_cast<size_t>(j) * d,
             covariance_ ? state.data() + layout.squares_at + static_cast<size_t>(j) * d * d : nullptr, q.data(),
             leaving ? old : nullptr, d);
      if (old) std::copy(q.begin(), q.end(), old);
    }
    state[3] = seen + 1;
    state[2] = leaving ? state[2] : state[2] + 1;
  }

  // sums += q - old, squares += q q^T - old old^T (old null: nothing leaves).
  static void update(double* sums, double* squares, const double* q, const double* old, int d) {
    for (int a = 0; a < d; ++a) sums[a] += old ? q[a] - old[a] : q[a];
    if (!squares) return;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) squares[a * d + b] += old ? q[a] * q[b] - old[a] * old[b] : q[a] * q[b];
  }

  const int sinks_ = static_cast<int>(options_.params.integer(kSink));
  const int future_ = static_cast<int>(options_.params.integer(kFuturePositions));
  const int window_ = static_cast<int>(options_.params.integer(kQueryWindow));
  const bool covariance_ = options_.params.text(kUseCovariance) == "true";
  const bool vnorm_ = options_.params.text(kUseValueNorm) == "true";
  const double epsilon_ = options_.params.real(kEpsilon);
};
}  // namespace

std::unique_ptr<Policy> make_expected_attention_policy(const PolicyOptions& o) {
  return std::make_unique<ExpectedAttentionPolicy>(o);
}
}  // namespace kvevict
