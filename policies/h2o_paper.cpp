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

// Rows handled together: their sums in key order are separate chains of float adds, each
// as slow as one add's latency, and eight of them interleave (perf: the lone chain was a
// third of this policy's time).
constexpr int kRowGroup = 8;

// The largest of row[0..n), -inf if none, as std::max from -inf computes it (NaN
// entries skipped), in eight independent lanes rather than one serial chain. Only the
// sign of a zero maximum may differ, which changes neither exp(l - m) nor a comparison.
float row_max(const float* row, int n) {
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

// The largest of row[j] over the listed keys, -inf if none, as std::max computes it
// (NaN entries skipped), in four independent lanes rather than one serial chain.
float listed_max(const float* row, const std::vector<int>& listed) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  float a = kNone, b = kNone, c = kNone, d = kNone;
  const size_t n = listed.size();
  size_t k = 0;
  for (; k + 4 <= n; k += 4) {
    a = std::max(a, row[listed[k]]);
    b = std::max(b, row[listed[k + 1]]);
    c = std::max(c, row[listed[k + 2]]);
    d = std::max(d, row[listed[k + 3]]);
  }
  for (; k < n; ++k) a = std::max(a, row[listed[k]]);
  return std::max(std::max(a, b), std::max(c, d));
}

// Leaves in `candidates` (ascending) the k with the highest acc (ties: the lower
// index). Only the set matters, and the order is total, so no sort by acc is needed;
// in the steady state all but one candidate stay, which is a scan for the one that
// goes (the lowest acc, the higher index among equals).
void keep_top(std::vector<int>& candidates, int k, const std::vector<float>& acc) {
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

// sums[r] = values[r * stride + 0] + values[r * stride + 1] + ... over lengths[r]
// values, added from the left in float as a plain loop adds them. With a full group
// the rows' chains run interleaved over their common length, then each finishes alone.
void sums_from_left(const float* values, int stride, const int* lengths, int rows, float* sums) {
  float s[kRowGroup] = {};
  int common = 0;
  if (rows == kRowGroup) {
    common = *std::min_element(lengths, lengths + rows);
    for (int j = 0; j < common; ++j)
      for (int r = 0; r < kRowGroup; ++r) s[r] += values[static_cast<size_t>(r) * stride + j];
  }
  for (int r = 0; r < rows; ++r) {
    const float* v = values + static_cast<size_t>(r) * stride;
    float sum = s[r];
    for (int j = common; j < lengths[r]; ++j) sum += v[j];
    sums[r] = sum;
  }
}

// One head through one layer, a block of rows at a time. Each row's unmasked softmax (its
// max m and exponentials e_j = exp(l_j - m)) is computed once: it is the output of the
// rows before the heavy budget fills, and when the kept keys hold the row's max their
// masked softmax reuses the same e_j. Every value is the one row_softmax computes, in the
// same order. Once the heavy budget fills, acc is non-zero only on the last row's heavy
// set, so the rows work on that list and the recent band (P arrives zeroed): only the
// max and the exponentials still pass over the whole row. A row's exponentials and sums
// do not depend on acc, so they are taken for a group of rows at once; the kept sets then
// follow row by row, and the masked softmaxes of the group finish together.
class HeadPass {
 public:
  HeadPass(int T, int heavy, int recent)
      : T_(T), heavy_(heavy), recent_(recent), e_(static_cast<size_t>(kRowGroup) * T),
        kept_values_(static_cast<size_t>(kRowGroup) * T), acc_(T, 0.0f), gathered_(T) {}

  // Rows r0 .. r0+rows-1: row i's logits at L + (i - r0) * n, its probabilities at P + i * T.
  void rows(int r0, int rows, const float* L, int n, float* P) {
    for (int g0 = r0; g0 < r0 + rows; g0 += kRowGroup)
      group(g0, std::min(kRowGroup, r0 + rows - g0), L + static_cast<size_t>(g0 - r0) * n, n, P);
  }

 private:
  void group(int i0, int rows, const float* L, int n, float* P) {
    int lengths[kRowGroup];
    float maxima[kRowGroup], sums[kRowGroup], kept_sums[kRowGroup];
    // e_j = std::exp(row_j - m), eight at a time with expf's bits (float_exp.h).
    for (int r = 0; r < rows; ++r) {
      const float* row = L + static_cast<size_t>(r) * n;
      maxima[r] = row_max(row, i0 + r + 1);
      exp_of_difference(row, maxima[r], e_.data() + static_cast<size_t>(r) * T_, i0 + r + 1);
      lengths[r] = i0 + r + 1;
    }
    sums_from_left(e_.data(), T_, lengths, rows, sums);
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const float* row = L + static_cast<size_t>(r) * n;
      const float* e = e_.data() + static_cast<size_t>(r) * T_;
      std::vector<int>& listed = listed_[r];
      listed.clear();
      if (i < heavy_ || heavy_ <= 0) {
        // Rows < hb see every earlier key (acc: rows < hb, keys < hb); with no heavy
        // hitters a row sees its recent band only.
        if (i < heavy_)
          for (int j = 0; j <= i; ++j) acc_[j] += e[j] / sums[r];
        band_start_[r] = i < heavy_ ? 0 : std::max(0, i - recent_);
      } else {
        band_start_[r] = heavy_step(i, e, sums[r], listed);
      }
      // The masked softmax over the kept keys (the listed ones, then the band), as a
      // softmax with the others masked: those add 0 to the sum and come out as
      // 0 / kept_sum, which is the 0 already in P unless kept_sum is NaN. Its maximum in
      // any order: only the sign of a zero may differ.
      const int count = static_cast<int>(listed.size()), band = band_start_[r], band_len = i + 1 - band;
      const float kept_max = std::max(listed_max(row, listed), row_max(row + band, band_len));
      float* values = kept_values_.data() + static_cast<size_t>(r) * T_;
      if (kept_max == maxima[r]) {
        for (int k = 0; k < count; ++k) values[k] = e[listed[k]];
        std::copy(e + band, e + i + 1, values + count);
      } else {
        for (int k = 0; k < count; ++k) gathered_[k] = row[listed[k]];
        exp_of_difference(gathered_.data(), kept_max, values, count);
        exp_of_difference(row + band, kept_max, values + count, band_len);
      }
      lengths[r] = count + band_len;
    }
    sums_from_left(kept_values_.data(), T_, lengths, rows, kept_sums);
    for (int r = 0; r < rows; ++r) {
      const std::vector<int>& listed = listed_[r];
      const int count = static_cast<int>(listed.size()), band = band_start_[r];
      float* out = P + static_cast<size_t>(i0 + r) * T_;
      float* values = kept_values_.data() + static_cast<size_t>(r) * T_;
      const float kept_sum = kept_sums[r];
      for (int k = 0; k < lengths[r]; ++k) values[k] /= kept_sum;
      for (int k = 0; k < count; ++k) out[listed[k]] = values[k];
      std::copy(values + count, values + lengths[r], out + band);
      if (std::isnan(kept_sum)) {
        size_t next = 0;
        for (int j = 0; j < band; ++j) {
          if (next < listed.size() && listed[next] == j)
            ++next;
          else
            out[j] = 0.0f / kept_sum;
        }
      }
    }
  }

  // One row i >= hb: the previous heavy set loses its lowest-acc key, acc moves to the new
  // heavy set (the kept candidates and key i), and listed gets the heavy keys below the
  // recent band, ascending; returns where the band starts. support: every key whose acc
  // may be non-zero, ascending.
  int heavy_step(int i, const float* e, float sum, std::vector<int>& listed) {
    if (i == heavy_) {  // acc holds rows < hb over keys < hb
      support_.resize(i);
      for (int j = 0; j < i; ++j) support_[j] = j;
    }
    // Keys with positive acc are the previous row's heavy set plus its own key.
    candidates_.clear();
    for (int j : support_)
      if (acc_[j] > 0) candidates_.push_back(j);
    keep_top(candidates_, std::min<int>(heavy_ - 1, candidates_.size()), acc_);
    // acc = (acc + p_i) on the new heavy set (the kept candidates and key i), 0 elsewhere.
    size_t c = 0;
    for (int j : support_) {
      if (c < candidates_.size() && candidates_[c] == j) {
        acc_[j] = acc_[j] + e[j] / sum;
        ++c;
      } else {
        acc_[j] = 0.0f;
      }
    }
    acc_[i] = acc_[i] + e[i] / sum;
    support_.swap(candidates_);
    support_.push_back(i);
    const int band = std::max(0, i - recent_);
    for (int j : support_)
      if (j < band) listed.push_back(j);
    return band;
  }

  const int T_, heavy_, recent_;
  std::vector<float> e_, kept_values_;  // per row of a group: [kRowGroup][T]
  std::vector<float> acc_, gathered_;
  std::vector<int> support_, candidates_;  // support: every key whose acc may be non-zero, ascending
  std::vector<int> listed_[kRowGroup];     // per row of a group: the heavy keys below its band, ascending
  int band_start_[kRowGroup] = {};
};

// Every head of a layer; heads are independent and run on all threads, each head's
// arithmetic unchanged.
class H2OPaperRows : public SimLayerRows {
 public:
  H2OPaperRows(int T, int n_q, int heavy, int recent) : T_(T) {
    heads_.reserve(n_q);
    for (int h = 0; h < n_q; ++h) heads_.emplace_back(T, heavy, recent);
  }

  void rows(int r0, int rows, int n, const float* logits, float* probs) override {
    const int n_q = static_cast<int>(heads_.size());
#pragma omp parallel for schedule(static)
    for (int h = 0; h < n_q; ++h)
      heads_[h].rows(r0, rows, logits + static_cast<size_t>(h) * rows * n, n, probs + static_cast<size_t>(h) * T_ * T_);
  }

 private:
  const int T_;
  std::vector<HeadPass> heads_;
};

class H2OPaperPolicy : public SimOnlyPolicy {
 public:
  using SimOnlyPolicy::SimOnlyPolicy;
  std::string name() const override { return "h2o-paper"; }
  std::string needs() const override { return "the unmasked softmax"; }

  // heavy = int(h*L), recent = int(r*L), as the paper sizes its masks.
  Budget layer_budget(int, const SequenceShape& shape) const override { return paper_split_budget(shape); }

  std::unique_ptr<SimLayerRows> layer_rows(int layer, const SequenceShape& shape, int T) const override {
    const Budget budget = layer_budget(layer, shape);
    return std::make_unique<H2OPaperRows>(T, shape.n_q_heads, budget.capacity - budget.recent, budget.recent);
  }

  void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                      float* probs) const override {
    layer_rows(layer, shape, T)->rows(0, T, T, logits, probs);
  }
};

}  // namespace

std::unique_ptr<Policy> make_h2o_paper_policy(const PolicyOptions& o) {
  return std::make_unique<H2OPaperPolicy>(o);
}

}  // namespace kvevict
