// The H2O paper's lm-eval simulation rule, step for step (PROTOCOLS.md §1), per
// attention head:
//   p_i = softmax of the UNMASKED causal logits of row i;
//   rows i < hb see every earlier key; acc = sum of p over rows < hb, keys < hb;
//   row i >= hb keeps the top-(hb-1) keys by acc plus key i, then acc = (acc + p_i)
//   restricted to that set; the recent band j >= i - rb is OR-ed in.
// Because acc accumulates the unmasked softmax (attention to keys already evicted),
// no real cache can run it: sim mode only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "policies/float_exp.h"
#include "policies/policy.h"

namespace kvevict {
namespace {

class H2OPaperPolicy : public SimOnlyPolicy {
 public:
  using SimOnlyPolicy::SimOnlyPolicy;
  std::string name() const override { return "h2o-paper"; }
  std::string needs() const override { return "the unmasked softmax"; }

  // heavy = int(h*L), recent = int(r*L), as the paper sizes its masks.
  Budget layer_budget(int, const SequenceShape& shape) const override { return paper_split_budget(shape); }

  void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                      float* probs) const override {
    const Budget budget = layer_budget(layer, shape);
    const int heavy = budget.capacity - budget.recent, recent = budget.recent;
    // Heads are independent: they run on all threads, each head's arithmetic unchanged.
#pragma omp parallel for schedule(static)
    for (int h = 0; h < shape.n_q_heads; ++h)
      simulate_head(T, heavy, recent, logits + static_cast<size_t>(h) * T * T, probs + static_cast<size_t>(h) * T * T);
  }

 private:
  // One head. Each row's unmasked softmax (its max m and exponentials e_j = exp(l_j - m))
  // is computed once: it is the output of the rows before the heavy budget fills, and
  // when the kept keys hold the row's max their masked softmax reuses the same e_j.
  // Every value is the one row_softmax computes, in the same order. Once the heavy
  // budget fills, acc is non-zero only on the last row's heavy set, so the rows work on
  // that list and the recent band (P arrives zeroed): only the max and the exponentials
  // still pass over the whole row.
  static void simulate_head(int T, int heavy, int recent, const float* L, float* P) {
    std::vector<float> e(T), acc(T, 0.0f);
    std::vector<int> support, candidates, kept;  // support: every key whose acc may be non-zero, ascending
    for (int i = 0; i < T; ++i) {
      const float* row = L + static_cast<size_t>(i) * T;
      float* out = P + static_cast<size_t>(i) * T;
      const float m = row_max(row, i + 1);
      // e_j = std::exp(row_j - m), eight at a time with expf's bits (float_exp.h); the
      // sum in key order.
      exp_of_difference(row, m, e.data(), i + 1);
      float sum = 0;
      for (int j = 0; j <= i; ++j) sum += e[j];
      kept.clear();
      if (i < heavy || heavy <= 0) {
        // Rows < hb see every earlier key (acc: rows < hb, keys < hb); with no heavy
        // hitters a row sees its recent band only.
        if (i < heavy)
          for (int j = 0; j <= i; ++j) acc[j] += e[j] / sum;
        for (int j = i < heavy ? 0 : std::max(0, i - recent); j <= i; ++j) kept.push_back(j);
      } else {
        heavy_step(i, heavy, recent, e, sum, acc, support, candidates, kept);
      }
      // The masked softmax over the kept keys, as a softmax with the others masked: those
      // add 0 to the sum and come out as 0 / kept_sum, which is the 0 already in P unless
      // kept_sum is NaN.
      float kept_max = -std::numeric_limits<float>::infinity();
      for (int j : kept) kept_max = std::max(kept_max, row[j]);
      float kept_sum = 0;
      if (kept_max == m) {
        for (int j : kept) kept_sum += (out[j] = e[j]);
      } else {
        for (int j : kept) kept_sum += (out[j] = std::exp(row[j] - kept_max));
      }
      for (int j : kept) out[j] /= kept_sum;
      if (std::isnan(kept_sum)) {
        size_t next = 0;
        for (int j = 0; j <= i; ++j) {
          if (next < kept.size() && kept[next] == j)
            ++next;
          else
            out[j] = 0.0f / kept_sum;
        }
      }
    }
  }

  // One row i >= hb: the previous heavy set loses its lowest-acc key, acc moves to the new
  // heavy set (the kept candidates and key i) and kept gets the heavy set and the recent
  // band, ascending. support: every key whose acc may be non-zero, ascending.
  static void heavy_step(int i, int heavy, int recent, const std::vector<float>& e, float sum,
                         std::vector<float>& acc, std::vector<int>& support, std::vector<int>& candidates,
                         std::vector<int>& kept) {
    if (i == heavy) {  // acc holds rows < hb over keys < hb
      support.resize(i);
      for (int j = 0; j < i; ++j) support[j] = j;
    }
    // Keys with positive acc are the previous row's heavy set plus its own key.
    candidates.clear();
    for (int j : support)
      if (acc[j] > 0) candidates.push_back(j);
    keep_top(candidates, std::min<int>(heavy - 1, candidates.size()), acc);
    // acc = (acc + p_i) on the new heavy set (the kept candidates and key i), 0 elsewhere.
    size_t c = 0;
    for (int j : support) {
      if (c < candidates.size() && candidates[c] == j) {
        acc[j] = acc[j] + e[j] / sum;
        ++c;
      } else {
        acc[j] = 0.0f;
      }
    }
    acc[i] = acc[i] + e[i] / sum;
    support.swap(candidates);
    support.push_back(i);
    // Kept: the heavy set and the recent band, ascending.
    const int band = std::max(0, i - recent);
    for (int j : support)
      if (j < band) kept.push_back(j);
    for (int j = band; j <= i; ++j) kept.push_back(j);
  }

  // The largest of row[0..n), -inf if none, as std::max from -inf computes it (NaN
  // entries skipped), in eight independent lanes rather than one serial chain. Only the
  // sign of a zero maximum may differ, which changes neither exp(l - m) nor a comparison.
  static float row_max(const float* row, int n) {
    constexpr int kLanes = 8;
    constexpr float kNone = -std::numeric_limits<float>::infinity();
    float lanes[kLanes] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
    int j = 0;
#if defined(__SSE__)
    // maxps(x, lane) is x > lane ? x : lane, which is std::max(lane, x) bit for bit
    // (a NaN x leaves the lane): the same eight lanes, in registers.
    __m128 low = _mm_set1_ps(kNone), high = low;
    for (; j + kLanes <= n; j += kLanes) {
      low = _mm_max_ps(_mm_loadu_ps(row + j), low);
      high = _mm_max_ps(_mm_loadu_ps(row + j + 4), high);
    }
    _mm_storeu_ps(lanes, low);
    _mm_storeu_ps(lanes + 4, high);
#else
    for (; j + kLanes <= n; j += kLanes)
      for (int k = 0; k < kLanes; ++k) lanes[k] = std::max(lanes[k], row[j + k]);
#endif
    float m = kNone;
    for (int k = 0; k < kLanes; ++k) m = std::max(m, lanes[k]);
    for (; j < n; ++j) m = std::max(m, row[j]);
    return m;
  }

  // Leaves in `candidates` (ascending) the k with the highest acc (ties: the lower
  // index). Only the set matters, and the order is total, so no sort by acc is needed;
  // in the steady state all but one candidate stay, which is a scan for the one that
  // goes (the lowest acc, the higher index among equals).
  static void keep_top(std::vector<int>& candidates, int k, const std::vector<float>& acc) {
    const int n = static_cast<int>(candidates.size());
    if (k == n - 1 && n > 0) {
      int dropped = 0;
      for (int c = 0; c < n; ++c)
        if (acc[candidates[c]] <= acc[candidates[dropped]]) dropped = c;  // candidates ascend: the last of equals
      candidates.erase(candidates.begin() + dropped);
      return;
    }
    if (k < n) {
      std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(),
                       [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
      candidates.resize(k);
      std::sort(candidates.begin(), candidates.end());
    }
  }
};

}  // namespace

std::unique_ptr<Policy> make_h2o_paper_policy(const PolicyOptions& o) {
  return std::make_unique<H2OPaperPolicy>(o);
}

}  // namespace kvevict
