// The fast paths of the policies agree with the general ones: the scored policies'
// single eviction with their top-k selection, h2o-paper's drop-one with its sort-based
// rule (on one thread and on several), the windowed scores with the plain channel sum.
#include "tests/catch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <omp.h>

#include "harness/model/threads.h"
#include "policies/registry.h"
#include "policies/slot_selection.h"
#include "policies/windowed_attention.h"

using namespace kvevict;

TEST_CASE("a single eviction picks the slot the general selection drops", "[policies][units][selection]") {
  std::mt19937 rng(11);
  int single = 0, general = 0;
  std::vector<int> kept, scratch;
  for (int trial = 0; trial < 20000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<int> positions;
    for (int p = static_cast<int>(rng() % 3); static_cast<int>(positions.size()) < n; p += 1 + static_cast<int>(rng() % 3))
      positions.push_back(p);
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(rng() % 4) * 0.25f;  // few values: many ties
    if (trial % 7 == 0)
      for (float& s : scores) s = std::ldexp(static_cast<float>(rng() % 1000), -10);
    Budget budget;
    budget.sink = static_cast<int>(rng() % 4);
    budget.recent = static_cast<int>(rng() % 8);
    budget.capacity = std::max(0, n - 1 - static_cast<int>(rng() % 3));  // mostly one to evict
    INFO("trial " << trial << " n " << n << " capacity " << budget.capacity);
    select_kept_slots(positions, scores.data(), budget, &kept, &scratch);
    REQUIRE(std::is_sorted(kept.begin(), kept.end()));
    const int evicted = single_evicted_slot(positions, scores.data(), budget);
    if (evicted < 0) {
      CHECK(static_cast<int>(kept.size()) != n - 1);
      ++general;
      continue;
    }
    ++single;
    REQUIRE(static_cast<int>(kept.size()) == n - 1);
    CHECK(std::find(kept.begin(), kept.end(), evicted) == kept.end());
    // The evicted slot has the lowest score among the candidates, and is the oldest of equals.
    int n_sink = 0;
    while (n_sink < n && positions[n_sink] < budget.sink) ++n_sink;
    const int candidates_end = n - std::min(budget.recent, n - n_sink);
    CHECK(evicted >= n_sink);
    CHECK(evicted < candidates_end);
    for (int s = n_sink; s < candidates_end; ++s) {
      CHECK(scores[s] >= scores[evicted]);
      if (s != evicted && scores[s] == scores[evicted]) CHECK(s > evicted);
    }
  }
  CHECK(single > 5000);
  CHECK(general > 1000);
}

TEST_CASE("a NaN score leaves the decision to the general selection", "[policies][units][selection]") {
  std::vector<int> positions = {0, 1, 2, 3, 4};
  std::vector<float> scores = {1, std::numeric_limits<float>::quiet_NaN(), 2, 3, 4};
  Budget budget;
  budget.capacity = 4;
  budget.recent = 1;
  CHECK(single_evicted_slot(positions, scores.data(), budget) == -1);
  scores[1] = 0.5f;
  CHECK(single_evicted_slot(positions, scores.data(), budget) == 1);
  scores[0] = 0.5f;  // equal scores: the older slot goes
  CHECK(single_evicted_slot(positions, scores.data(), budget) == 0);
}

namespace {

// The plain ring (window floats per slot, channel = step % window) that window_sum reads
// and the running-sum ring must agree with.
void record_window(kvevict::HeadSlots& head, const float* attention, int window) {
  const int channel = head.steps % window;
  for (size_t s = 0; s < head.positions.size(); ++s) head.values[s * window + channel] = attention[s];
}

// h2o-paper's rule as first written (PROTOCOLS.md §1): a partial sort of the previous
// heavy set for every row, one head after another.
void h2o_paper_reference(int T, int n_q, int heavy, int recent, const float* logits, float* probs) {
  std::vector<float> p(T), acc(T);
  std::vector<char> keep(T);
  std::vector<int> candidates;
  for (int h = 0; h < n_q; ++h) {
    const float* L = logits + static_cast<size_t>(h) * T * T;
    float* P = probs + static_cast<size_t>(h) * T * T;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int i = 0; i < T; ++i) {
      const float* row = L + static_cast<size_t>(i) * T;
      std::fill(keep.begin(), keep.begin() + i + 1, 0);
      if (i < heavy) {
        std::fill(keep.begin(), keep.begin() + i + 1, 1);
        row_softmax(row, i, nullptr, p.data());
        for (int j = 0; j <= i; ++j) acc[j] += p[j];
      } else if (heavy > 0) {
        candidates.clear();
        for (int j = 0; j < i; ++j)
          if (acc[j] > 0) candidates.push_back(j);
        const int k = std::min<int>(heavy - 1, candidates.size());
        std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                          [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
        std::vector<char> heavy_mask(i + 1, 0);
        for (int c = 0; c < k; ++c) heavy_mask[candidates[c]] = 1;
        heavy_mask[i] = 1;
        row_softmax(row, i, nullptr, p.data());
        for (int j = 0; j <= i; ++j) {
          acc[j] = heavy_mask[j] ? acc[j] + p[j] : 0.0f;
          keep[j] = heavy_mask[j];
        }
      }
      for (int j = std::max(0, i - recent); j <= i; ++j) keep[j] = 1;
      row_softmax(row, i, keep.data(), P + static_cast<size_t>(i) * T);
    }
  }
}

// h2o-paper's simulate_layer on `logits` [n_q, T, T] at each ratio, on 1 and 2 threads,
// against the sort-based reference bit for bit (memcmp: NaNs included, which == would call
// different). With expect_nans the reference must hold NaNs at every ratio.
void check_h2o_paper_against_reference(const std::vector<float>& logits, const SequenceShape& shape,
                                       std::initializer_list<double> ratios, bool expect_nans) {
  const int T = static_cast<int>(shape.length), n_q = shape.n_q_heads;
  const int threads_before = omp_get_max_threads();
  for (double ratio : ratios) {
    PolicyOptions options;
    options.budget.ratio = ratio;
    auto policy = make_policy("h2o-paper", options);
    const Budget budget = policy->layer_budget(0, shape);
    std::vector<float> expected(logits.size(), 0.0f);
    h2o_paper_reference(T, n_q, budget.capacity - budget.recent, budget.recent, logits.data(), expected.data());
    if (expect_nans) {
      size_t nans = 0;
      for (float x : expected) nans += std::isnan(x);
      CHECK(nans > 0);
    }
    for (int threads : {1, 2}) {
      set_thread_count(threads);
      std::vector<float> probs(logits.size(), 0.0f);
      policy->as_sim_only()->simulate_layer(0, shape, T, logits.data(), probs.data());
      size_t differ = 0;
      for (size_t x = 0; x < probs.size(); ++x)
        differ += std::memcmp(&probs[x], &expected[x], sizeof(float)) != 0;
      INFO("ratio " << ratio << " threads " << threads);
      CHECK(differ == 0);
      // Fed a block of rows at a time, as sim mode streams them ([n_q][rows][n] with n
      // = r0 + rows keys): the same bits, for blocks that split a group of eight rows.
      for (int block_rows : {13, 8, 1}) {
        std::vector<float> streamed(logits.size(), 0.0f), block;
        auto pass = policy->as_sim_only()->layer_rows(0, shape, T);
        REQUIRE(pass != nullptr);
        for (int r0 = 0; r0 < T; r0 += block_rows) {
          const int rows = std::min(block_rows, T - r0), n = r0 + rows;
          block.assign(static_cast<size_t>(n_q) * rows * n, std::numeric_limits<float>::quiet_NaN());
          for (int h = 0; h < n_q; ++h)
            for (int r = 0; r < rows; ++r)
              std::copy_n(logits.begin() + (static_cast<size_t>(h) * T + r0 + r) * T, r0 + r + 1,
                          block.begin() + (static_cast<size_t>(h) * rows + r) * n);
          pass->rows(r0, rows, n, block.data(), streamed.data());
        }
        size_t streamed_differ = 0;
        for (size_t x = 0; x < streamed.size(); ++x)
          streamed_differ += std::memcmp(&streamed[x], &expected[x], sizeof(float)) != 0;
        INFO("blocks of " << block_rows << " rows");
        CHECK(streamed_differ == 0);
      }
    }
  }
  set_thread_count(threads_before);
}

}  // namespace

TEST_CASE("h2o-paper's drop-one and threaded heads agree bit for bit with its sort-based rule",
          "[policies][units][selection]") {
  // 91 rows: h2o-paper takes rows eight at a time, and the last group is shorter.
  for (const int T : {96, 91}) {
    const int n_q = 5;
    std::mt19937 rng(3);
    std::vector<float> logits(static_cast<size_t>(n_q) * T * T);
    // Few distinct logits: equal accumulated scores happen and their tie-break decides.
    for (size_t x = 0; x < logits.size(); ++x) logits[x] = static_cast<float>(rng() % 3);
    for (int i = 0; i < T; ++i)
      std::fill_n(logits.begin() + static_cast<size_t>(i) * T, T, 1.0f);  // head 0: all logits equal
    // Head 1: the first rows attend only their own key (the others' probabilities underflow
    // to 0), so every key's accumulated score is exactly 1 and only the tie-break chooses;
    // the later rows attend uniformly, so which keys stayed shows in their probabilities.
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j)
        logits[(static_cast<size_t>(T) + i) * T + j] = i >= 32 || i == j ? 0.0f : -200.0f;
    // Heads 2 and 3: continuous logits, so a row's maximum is often not among the kept
    // keys; head 3 also hides the keys older than a window of 10, as a model's sliding
    // window does before the policy sees the logits.
    std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
    for (int h = 2; h <= 3; ++h)
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j)
          logits[(static_cast<size_t>(h) * T + i) * T + j] =
              h == 3 && j <= i - 10 ? -std::numeric_limits<float>::infinity() : uniform(rng);
    SequenceShape shape;
    shape.length = T;
    shape.n_layers = 1;
    shape.n_q_heads = shape.n_kv_heads = n_q;
    check_h2o_paper_against_reference(logits, shape, {0.1, 0.3, 0.6}, false);
  }
}

TEST_CASE("h2o-paper on rows with NaN and all -inf logits agrees bit for bit with its sort-based rule",
          "[policies][units][selection]") {
  for (const int T : {80, 77}) {
    const int n_q = 3;
    constexpr float kInf = std::numeric_limits<float>::infinity();
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(n_q) * T * T);
    for (float& l : logits) l = uniform(rng);
    auto at = [&](int h, int i, int j) -> float& { return logits[(static_cast<size_t>(h) * T + i) * T + j]; };
    // Head 0: a NaN logit now and then (its row's sums turn NaN, and with them the
    // probabilities of keys the row does not keep).
    for (int i = 0; i < T; i += 7) at(0, i, (i * 5) % (i + 1)) = std::numeric_limits<float>::quiet_NaN();
    // Head 1: rows whose every logit is -inf (NaN exponentials), and rows where only the
    // evicted keys carry the maximum.
    for (int i = 30; i < T; i += 9)
      for (int j = 0; j <= i; ++j) at(1, i, j) = -kInf;
    for (int i = 40; i < T; i += 5) at(1, i, 1) = 50.0f;
    // Head 2: +inf logits.
    for (int i = 20; i < T; i += 11) at(2, i, i / 2) = kInf;
    SequenceShape shape;
    shape.length = T;
    shape.n_layers = 1;
    shape.n_q_heads = shape.n_kv_heads = n_q;
    check_h2o_paper_against_reference(logits, shape, {0.1, 0.25, 0.5}, true);
  }
}

TEST_CASE("windowed scores: the running sum and the eight-lane sum equal the plain loop bit for bit",
          "[policies][units][selection]") {
  std::mt19937 rng(17);
  for (int window : {1, 2, 5, 32}) {
    HeadSlots plain, running;
    const int running_channels = running_window_channels(window);
    std::vector<float> attention, expected, got_plain, got_running;
    for (int step = 0; step < 300; ++step) {
      for (HeadSlots* head : {&plain, &running}) head->positions.push_back(step);
      plain.values.resize(plain.values.size() + window, 0.0f);
      running.values.resize(running.values.size() + running_channels, 0.0f);
      const size_t n = plain.positions.size();
      attention.resize(n);
      // Magnitudes over many binades: the order of the adds shows in the last bits.
      for (float& a : attention) a = std::ldexp(static_cast<float>(1 + rng() % 100000), -static_cast<int>(rng() % 40));
      record_window(plain, attention.data(), window);
      record_running_window(running, attention.data(), window);
      plain.steps++;
      running.steps++;
      expected.assign(n, 0.0f);
      for (size_t s = 0; s < n; ++s) {
        float total = 0;
        for (int c = 0; c < window; ++c) total += plain.values[s * window + c];
        expected[s] = total;
      }
      got_plain.assign(n, -1.0f);
      got_running.assign(n, -1.0f);
      window_sum(plain, window, got_plain.data());
      running_window_sum(running, window, got_running.data());
      INFO("window " << window << " step " << step);
      REQUIRE(got_plain == expected);
      REQUIRE(got_running == expected);
      if (n > 20 || rng() % 3 == 0) {  // evict a slot, as a compression step does
        const size_t slot = rng() % n;
        plain.positions.erase(plain.positions.begin() + slot);
        running.positions.erase(running.positions.begin() + slot);
        plain.values.erase(plain.values.begin() + slot * window, plain.values.begin() + (slot + 1) * window);
        running.values.erase(running.values.begin() + slot * running_channels,
                             running.values.begin() + (slot + 1) * running_channels);
      }
    }
  }
}

TEST_CASE("key pooling without bounds checks in the interior equals the checked loop bit for bit",
          "[policies][units][selection]") {
  std::mt19937 rng(23);
  for (int kernel : {1, 3, 5, 7})
    for (bool use_max : {false, true})
      for (int n = 0; n <= 20; ++n) {
        std::vector<float> scores(n), expected(n);
        for (float& s : scores) s = std::ldexp(static_cast<float>(1 + rng() % 100000), -static_cast<int>(rng() % 30));
        const int half = kernel / 2;
        for (int s = 0; s < n; ++s) {
          float acc = use_max ? scores[s] : 0.0f;
          for (int k = std::max(0, s - half); k <= std::min(n - 1, s + half); ++k)
            acc = use_max ? std::max(acc, scores[k]) : acc + scores[k];
          expected[s] = kernel <= 1 ? scores[s] : use_max ? acc : acc / kernel;
        }
        pool_keys(scores.data(), n, kernel, use_max);
        INFO("kernel " << kernel << " max " << use_max << " n " << n);
        CHECK(scores == expected);
      }
}
