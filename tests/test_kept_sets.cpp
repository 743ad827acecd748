// Which tokens each policy keeps, on attention (or key norms, or logits) made by hand:
// the expected sets are written out here, worked out from the policy's definition, or
// computed by a few lines of brute force from that definition. A policy whose ranking
// were inverted, whose recent window were dropped or whose ties went the other way
// keeps other tokens than these. LayerStates are driven as the policy driver drives
// them (tests/policy_drive.h); sim-only policies get logits.
#include "tests/catch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "policies/registry.h"
#include "tests/policy_drive.h"

using namespace kvevict;

namespace {

using Positions = std::vector<int>;

// A budget of `tokens` tokens; heavy_share < 0: the policy's default.
PolicyOptions token_budget(int tokens, double heavy_share = -1) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  o.budget.heavy_share = heavy_share;
  return o;
}

// The unnormalised weight query head h at step i gives key j (it sees j). Each row the
// policy observes is these weights over the keys the query sees, divided by their sum.
using Weight = std::function<double(int h, int i, int j)>;
// weights[j] for one query: the keys it attends and with what weight (the rest: 0).
using Row = std::map<int, double>;

float unit_norm(int, int) { return 1.0f; }

test::LayerTrace run(const Policy& policy, const SequenceShape& shape, const Weight& weight,
                     const test::KeyNormFn& key_norm = unit_norm, int layer = 0) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  return test::drive_layer_states(
      states, shape,
      [&](int h, int i, const std::vector<int>& positions, const std::vector<char>* visible, float* out) {
        std::vector<double> w(positions.size(), 0.0);
        double sum = 0;
        for (size_t s = 0; s < positions.size(); ++s)
          if (!visible || (*visible)[s]) sum += (w[s] = weight(h, i, positions[s]));
        REQUIRE(sum > 0);  // a test's rows always give some seen key a weight
        for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(w[s] / sum);
      },
      key_norm);
}

// All attention of query i on key target(i).
Weight one_hot(std::function<int(int i)> target) {
  return [target](int, int i, int j) { return j == target(i) ? 1.0 : 0.0; };
}

// rows[i] for the listed queries; any other query attends itself only.
Weight by_rows(std::map<int, Row> rows) {
  return [rows](int, int i, int j) {
    auto row = rows.find(i);
    if (row == rows.end()) return j == i ? 1.0 : 0.0;
    auto w = row->second.find(j);
    return w == row->second.end() ? 0.0 : w->second;
  };
}

// The positions KV head kv holds after the last query.
Positions final_kept(const test::LayerTrace& trace, int kv = 0) { return trace.positions.back()[kv]; }

Positions range(int first, int last) {  // first .. last, inclusive
  Positions p;
  for (int j = first; j <= last; ++j) p.push_back(j);
  return p;
}

Positions join(Positions a, const Positions& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

// Brute force for policies whose score is fixed when a token enters (knorm, random,
// local, streamingllm): after every step past the prefill, the sinks (positions < sink)
// and the last `recent` slots stay, and of the others the `capacity - sinks - recent`
// with the highest score (among equals the more recent). Returns the slots after each step.
std::vector<Positions> static_score_reference(int length, int prefill, const Budget& budget,
                                              const std::function<double(int position)>& score) {
  std::vector<Positions> after;
  Positions held;
  for (int i = 0; i < length; ++i) {
    held.push_back(i);
    if (i >= prefill - 1 && static_cast<int>(held.size()) > budget.capacity) {
      Positions sinks, middle, recent;
      for (size_t s = 0; s < held.size(); ++s) {
        if (held[s] < budget.sink) sinks.push_back(held[s]);
        else if (static_cast<int>(held.size() - s) <= budget.recent) recent.push_back(held[s]);
        else middle.push_back(held[s]);
      }
      std::sort(middle.begin(), middle.end(), [&](int a, int b) { return score(a) != score(b) ? score(a) > score(b) : a > b; });
      const int heavy = std::max(0, budget.capacity - static_cast<int>(sinks.size()) - static_cast<int>(recent.size()));
      middle.resize(std::min<size_t>(middle.size(), heavy));
      held = join(join(sinks, middle), recent);
    }
    after.push_back(held);
  }
  return after;
}

}  // namespace

// ---------------------------------------------------------------------------------
// h2o: the attention a key received while cached, summed; the recent window stays.

TEST_CASE("h2o keeps the keys with the most accumulated attention plus the recent window", "[policies][kept]") {
  // Eight queries, one compression after the last (the prefill is the whole sequence).
  // Query i puts all its attention on one key: the counts below are the scores.
  //   query:  0 1 2 3 4 5 6 7
  //   key:    0 1 1 1 2 4 6 6     -> scores k0 1, k1 3, k2 1, k3 0, k4 1, k5 0, k6 2, k7 0
  const SequenceShape shape = test::sequence_shape(8, 8);
  const int target[] = {0, 1, 1, 1, 2, 4, 6, 6};
  const Weight weight = one_hot([&](int i) { return target[i]; });
  auto kept = [&](double share) {
    return final_kept(run(*make_policy("h2o", token_budget(4, share)), shape, weight));
  };
  // Default split of 4 tokens: 2 heavy among keys 0..5, 2 recent (6, 7). k1 (3) is first;
  // k0, k2 and k4 tie at 1 and the most recent of them, k4, stays.
  CHECK(kept(-1) == Positions{1, 4, 6, 7});
  // The heavy/recent split moves with the share: 1 heavy + 3 recent, 4 heavy + 0 recent.
  CHECK(kept(0.25) == Positions{1, 5, 6, 7});
  CHECK(kept(1.0) == Positions{1, 2, 4, 6});  // k1 3, k6 2, then k4 and k2 of the three tied at 1
}

TEST_CASE("h2o evicting one key per step: each step's slots by hand, a tie goes to the newer key",
          "[policies][kept]") {
  // Budget 3 = 1 heavy + 2 recent, compression after every query. Query targets (a query
  // whose target was evicted attends itself): 0 0 1 0 4 4 4 7.
  //   step 3: slots 0 1 2 3, acc k0 3, k1 1; recent 2 3; k1 goes.
  //   step 4: target 4 (itself); candidates k0 3, k2 0: k2 goes.     step 5: k3 (0) goes.
  //   step 6: k4 has 3 (queries 4, 5, 6) = k0's 3: the older, k0, goes.
  //   step 7: candidates k4 3, k5 0: k5 goes.
  const SequenceShape shape = test::sequence_shape(8, 0);
  const int target[] = {0, 0, 1, 0, 4, 4, 4, 7};
  auto policy = make_policy("h2o", token_budget(3));
  const test::LayerTrace trace = run(*policy, shape, [&](int, int i, int j) {
    const bool cached = i < 3 || target[i] != 1;  // key 1 is gone after step 3
    return j == (cached ? target[i] : i) ? 1.0 : 0.0;
  });
  const std::vector<Positions> expected = {{0},       {0, 1},    {0, 1, 2}, {0, 2, 3},
                                           {0, 3, 4}, {0, 4, 5}, {4, 5, 6}, {4, 6, 7}};
  for (int i = 0; i < shape.length; ++i) {
    INFO("step " << i);
    CHECK(trace.positions[i][0] == expected[i]);
  }
}

TEST_CASE("h2o under GQA: a KV head ranks its query heads' attention by mean or by max", "[policies][kept]") {
  // 4 query heads over 2 KV heads (0, 1 -> KV 0; 2, 3 -> KV 1); one heavy slot, no recent
  // window. Queries 0..4 attend themselves (every key 0..4 gets 1); query 5:
  //   head 0: k1 .6, k2 .4     head 1: k3 .6, k2 .4     heads 2 and 3: k0 1
  // KV 0 by mean: k1 1.3, k2 1.4, k3 1.3: k2.  By max: k1 1.6, k2 1.4, k3 1.6: the newer, k3.
  // KV 1: k0 2 either way. Key 5 has 0.
  const SequenceShape shape = test::sequence_shape(6, 6, 4, 2);
  const Weight weight = [](int h, int i, int j) {
    if (i < 5) return j == i ? 1.0 : 0.0;
    const std::map<int, Row> rows = {{0, {{1, .6}, {2, .4}}}, {1, {{3, .6}, {2, .4}}}, {2, {{0, 1}}}, {3, {{0, 1}}}};
    const Row& row = rows.at(h);
    return row.count(j) ? row.at(j) : 0.0;
  };
  for (const std::string reduce : {"mean", "max"}) {
    PolicyOptions o = token_budget(1, 1.0);
    o.params.set("group_reduce", reduce);
    const test::LayerTrace trace = run(*make_policy("h2o", o), shape, weight);
    INFO(reduce);
    CHECK(final_kept(trace, 0) == (reduce == "mean" ? Positions{2} : Positions{3}));
    CHECK(final_kept(trace, 1) == Positions{0});
  }
}

// ---------------------------------------------------------------------------------
TEST_CASE("tova keeps what the last query attends most, averaged over all heads of the layer", "[policies][kept]") {
  // Two KV heads (one query head each); one compression after query 5. Earlier queries
  // attend keys 1 and 4 only, which must not count: TOVA scores the last query alone.
  //   query 5, head 0: k0 .4, k1 .3, k2 .2, k5 .1      head 1: k3 .4, k4 .3, k2 .2, k5 .1
  //   layer average:   k0 .2, k1 .15, k2 .2, k3 .2, k4 .15, k5 .1
  const SequenceShape shape = test::sequence_shape(6, 6, 2, 2);
  const Weight weight = [](int h, int i, int j) {
    if (i < 5) return j == std::min(i, h == 0 ? 1 : 4) ? 1.0 : 0.0;
    const Row row = h == 0 ? Row{{0, .4}, {1, .3}, {2, .2}, {5, .1}} : Row{{3, .4}, {4, .3}, {2, .2}, {5, .1}};
    return row.count(j) ? row.at(j) : 0.0;
  };
  SECTION("3 tokens, all heavy (TOVA's default): one decision for both heads") {
    const test::LayerTrace trace = run(*make_policy("tova", token_budget(3)), shape, weight);
    CHECK(final_kept(trace, 0) == Positions{0, 2, 3});
    CHECK(final_kept(trace, 1) == Positions{0, 2, 3});
  }
  SECTION("4 tokens split 2 heavy + 2 recent: keys 4, 5 stay; k0, k2, k3 tie and the newer two stay") {
    const test::LayerTrace trace = run(*make_policy("tova", token_budget(4, 0.5)), shape, weight);
    CHECK(final_kept(trace, 0) == Positions{2, 3, 4, 5});
    CHECK(final_kept(trace, 1) == Positions{2, 3, 4, 5});
  }
}

// ---------------------------------------------------------------------------------
TEST_CASE("snapkv sums the attention of the queries in its window, pooled along the keys", "[policies][kept]") {
  // 8 queries, one compression after the last; 4 tokens = 2 heavy + 2 recent (6, 7).
  // Queries 0..5 attend key 0 (outside a window of 2); queries 6 and 7 give k1 and k3
  // .5 each. Window sums: k1 1, k3 1, the rest 0.
  //   kernel 1: k1, k3.
  //   kernel 3 (average, zero padding): k2 (1 + 0 + 1) / 3 is the best; k0, k1, k3, k4
  //   tie at 1/3 and the newest, k4, stays.
  const SequenceShape shape = test::sequence_shape(8, 8);
  const Weight weight = [](int, int i, int j) {
    if (i < 6) return j == 0 ? 1.0 : 0.0;
    return j == 1 || j == 3 ? 0.5 : 0.0;
  };
  for (int kernel : {1, 3}) {
    PolicyOptions o = token_budget(4);
    o.params.set("window", 2);
    o.params.set("kernel", kernel);
    INFO("kernel " << kernel);
    CHECK(final_kept(run(*make_policy("snapkv", o), shape, weight)) ==
          (kernel == 1 ? Positions{1, 3, 6, 7} : Positions{2, 4, 6, 7}));
  }
  SECTION("max pooling: k0..k4 all reach 1; the newest two, k3 and k4, stay") {
    PolicyOptions o = token_budget(4);
    o.params.set("window", 2);
    o.params.set("kernel", 3);
    o.params.set("pooling", "max");
    CHECK(final_kept(run(*make_policy("snapkv", o), shape, weight)) == Positions{3, 4, 6, 7});
  }
}

TEST_CASE("pyramidkv keeps snapkv's best keys, more of them in lower layers", "[policies][kept]") {
  // 12 queries, 3 layers, 6 tokens = 3 heavy + 3 recent (9, 10, 11) on average. Beta 20:
  // heavy 5.85, 3, 0.15 per layer, rounded as cumulative sums: 6, 3, 0.
  // Queries 10 and 11 rank the keys 4 > 7 > 0 > 2 > 8 > 1 > 5 > 3 > 6 (window 2, kernel 1).
  const SequenceShape shape = test::sequence_shape(12, 12, 1, 1, 3);
  const Row ranked = {{4, 8}, {7, 7}, {0, 6}, {2, 5}, {8, 4}, {1, 3}, {5, 2}, {3, 1}};
  const Weight weight = [&](int, int i, int j) {
    if (i < 10) return j == i ? 1.0 : 0.0;
    return ranked.count(j) ? ranked.at(j) : 0.0;
  };
  PolicyOptions o = token_budget(6);
  o.params.set("window", 2);
  o.params.set("kernel", 1);
  auto policy = make_policy("pyramidkv", o);
  const std::vector<int> capacity = {9, 6, 3};
  const std::vector<Positions> expected = {{0, 1, 2, 4, 7, 8, 9, 10, 11}, {0, 4, 7, 9, 10, 11}, {9, 10, 11}};
  for (int layer = 0; layer < 3; ++layer) {
    INFO("layer " << layer);
    CHECK(policy->layer_budget(layer, shape).capacity == capacity[layer]);
    CHECK(final_kept(run(*policy, shape, weight, unit_norm, layer)) == expected[layer]);
  }
}

// ---------------------------------------------------------------------------------
TEST_CASE("scissorhands keeps the keys most often above the uniform share in the window", "[policies][kept]") {
  // 8 queries, one compression after the last; 4 tokens = 2 heavy + 2 recent (6, 7);
  // window 3 (queries 5, 6, 7; thresholds 1/6, 1/7, 1/8). Queries 0..4 attend key 0.
  //   query 5: k3 .6, k1 .2, k0 .1, k5 .1      -> above 1/6: k3, k1
  //   query 6: k6 .55, k1 .2, k2 .15, k0 .1    -> above 1/7: k6, k1, k2
  //   query 7: k7 .55, k1 .2, k2 .15, k0 .1    -> above 1/8: k7, k1, k2
  // Counts: k1 3, k2 2, k3 1 (though it got the most attention), k0 0, k4 0, k5 0.
  const SequenceShape shape = test::sequence_shape(8, 8);
  const Weight weight = by_rows({{0, {{0, 1}}},
                                 {1, {{0, 1}}},
                                 {2, {{0, 1}}},
                                 {3, {{0, 1}}},
                                 {4, {{0, 1}}},
                                 {5, {{3, .6}, {1, .2}, {0, .1}, {5, .1}}},
                                 {6, {{6, .55}, {1, .2}, {2, .15}, {0, .1}}},
                                 {7, {{7, .55}, {1, .2}, {2, .15}, {0, .1}}}});
  PolicyOptions o = token_budget(4);
  o.params.set("window", 3);
  CHECK(final_kept(run(*make_policy("scissorhands", o), shape, weight)) == Positions{1, 2, 6, 7});
}

// ---------------------------------------------------------------------------------
TEST_CASE("knorm keeps the keys with the smallest L2 norm; norms equal to 12 bits tie", "[policies][kept]") {
  // Two KV heads with their own key norms (attention plays no part).
  //   KV 0, positions 0..7: 2, .5, 3, .75, 1, .5, 4, 1.0001 (1.0001 is 1 to 12 bits)
  //   KV 1: position p has KV 0's norm of position 7 - p.
  const std::vector<float> norms = {2.0f, 0.5f, 3.0f, 0.75f, 1.0f, 0.5f, 4.0f, 1.0001f};
  const std::vector<double> rounded = {2, .5, 3, .75, 1, .5, 4, 1};  // what knorm ranks
  auto norm_of = [&](const std::vector<double>& list, int kv, int position) { return list[kv == 0 ? position : 7 - position]; };
  const test::KeyNormFn key_norm = [&](int kv, int position) { return norms[kv == 0 ? position : 7 - position]; };
  const SequenceShape shape = test::sequence_shape(8, 8, 2, 2);
  const Weight uniform = [](int, int, int) { return 1.0; };
  SECTION("4 tokens, all heavy (knorm's default)") {
    const test::LayerTrace trace = run(*make_policy("knorm", token_budget(4)), shape, uniform, key_norm);
    // KV 0: k1, k5 (.5), k3 (.75), then k4 (1) and k7 (1.0001) tie: the newer, k7.
    CHECK(final_kept(trace, 0) == Positions{1, 3, 5, 7});
    // KV 1: k2, k6 (.5), k4 (.75), then k0 (1.0001) and k3 (1) tie: the newer, k3.
    CHECK(final_kept(trace, 1) == Positions{2, 3, 4, 6});
  }
  SECTION("4 tokens, 2 heavy + 2 recent: the two smallest norms among keys 0..5") {
    const test::LayerTrace trace = run(*make_policy("knorm", token_budget(4, 0.5)), shape, uniform, key_norm);
    CHECK(final_kept(trace, 0) == Positions{1, 5, 6, 7});
    CHECK(final_kept(trace, 1) == Positions{2, 4, 6, 7});
  }
  SECTION("one eviction per step from the start: every step as the brute force") {
    const SequenceShape steady = test::sequence_shape(8, 0, 2, 2);
    for (double share : {1.0, 0.5}) {
      auto policy = make_policy("knorm", token_budget(3, share));
      const test::LayerTrace trace = run(*policy, steady, uniform, key_norm);
      for (int kv = 0; kv < 2; ++kv) {
        const auto expected = static_score_reference(8, 0, policy->layer_budget(0, steady),
                                                     [&](int p) { return -norm_of(rounded, kv, p); });
        for (int i = 0; i < 8; ++i) {
          INFO("share " << share << " KV " << kv << " step " << i);
          CHECK(trace.positions[i][kv] == expected[i]);
        }
      }
      // By hand, KV 0 with 3 tokens all heavy: after step 7 k1, k3, k5.
      if (share == 1.0) CHECK(trace.positions[7][0] == Positions{1, 3, 5});
    }
  }
}

// ---------------------------------------------------------------------------------
namespace {
// Random's documented score (policies/random.cpp): splitmix64 of the seed and of
// (layer, KV head, position), its top 24 bits as a fraction; the highest stay.
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double random_score(uint64_t seed, int layer, int kv, int position) {
  const uint64_t h = splitmix(seed ^ splitmix((uint64_t(layer) << 40) ^ (uint64_t(kv) << 32) ^ uint64_t(position)));
  return static_cast<double>(h >> 40) / static_cast<double>(1ULL << 24);
}
}  // namespace

TEST_CASE("random keeps the tokens with the highest seeded score, whatever the attention", "[policies][kept]") {
  // 24 tokens, 2 layers x 2 KV heads, 8 tokens = 4 heavy + 4 recent, seed 7: the kept sets
  // at every step are the brute force's over random's own scores, and the same under two
  // unrelated attentions.
  PolicyOptions o = token_budget(8);
  o.params.set("seed", 7);
  auto policy = make_policy("random", o);
  const Weight first = [](int h, int i, int j) { return 1.0 + ((h + 3 * i + 5 * j) % 7); };
  const Weight second = [](int h, int i, int j) { return j == (i + h) / 2 ? 50.0 : 1.0; };
  for (int prefill : {24, 0}) {
    const SequenceShape shape = test::sequence_shape(24, prefill, 4, 2, 2);
    for (int layer = 0; layer < 2; ++layer) {
      const test::LayerTrace a = run(*policy, shape, first, unit_norm, layer);
      const test::LayerTrace b = run(*policy, shape, second, unit_norm, layer);
      for (int kv = 0; kv < 2; ++kv) {
        const auto expected = static_score_reference(24, prefill, policy->layer_budget(layer, shape),
                                                     [&](int p) { return random_score(7, layer, kv, p); });
        for (int i = 0; i < 24; ++i) {
          INFO("prefill " << prefill << " layer " << layer << " KV " << kv << " step " << i);
          CHECK(a.positions[i][kv] == expected[i]);
          CHECK(b.positions[i][kv] == expected[i]);
        }
      }
      CHECK(final_kept(a, 0) != final_kept(a, 1));  // each head draws its own scores
    }
  }
}

// ---------------------------------------------------------------------------------
TEST_CASE("streamingllm keeps the sink tokens and the most recent ones; local the most recent only",
          "[policies][kept]") {
  const SequenceShape shape = test::sequence_shape(12, 0);
  // Attention that favours the middle keys, which neither policy may keep.
  const Weight middle = [](int, int, int j) { return j >= 4 && j < 8 ? 100.0 : 1.0; };
  for (int sinks : {4, 2}) {
    PolicyOptions o = token_budget(8);
    o.params.set("n_sink", sinks);
    const test::LayerTrace trace = run(*make_policy("streamingllm", o), shape, middle);
    for (int i = 0; i < 12; ++i) {
      INFO("sinks " << sinks << " step " << i);
      // Up to 8 tokens everything; then the sinks and the newest 8 - sinks.
      CHECK(trace.positions[i][0] == (i < 8 ? range(0, i) : join(range(0, sinks - 1), range(i - 7 + sinks, i))));
    }
  }
  const test::LayerTrace local = run(*make_policy("local", token_budget(4, 0.5)), shape, middle);
  for (int i = 0; i < 12; ++i) {
    INFO("local step " << i);
    CHECK(local.positions[i][0] == range(std::max(0, i - 3), i));
  }
}

// ---------------------------------------------------------------------------------
// SCORED+PATTERN: query i sees its pattern, itself and the heavy hitters chosen after
// query i-1: the best-scoring cached keys that the pattern does not give query i. The
// cache keeps those and every key a later query's pattern attends (static_pattern.h).
namespace {

struct Pattern {
  std::function<bool(int i, int j)> attends, needed_later;
};
// Sparse Transformer (Child et al. 2019), as policies/sparse_*.cpp state them.
Pattern strided(int l) {
  return {[l](int i, int j) { return i - j < l || (i - j) % l == 0; }, [](int, int) { return true; }};
}
Pattern fixed(int l, int c) {
  return {[l, c](int i, int j) { return j / l == i / l || j % l >= l - c; },
          [l, c](int i, int j) { return j % l >= l - c || j / l == (i + 1) / l; }};
}

// Accumulated attention per KV head; the last query's, averaged over the layer; the position.
enum class Scorer { H2O, TOVA, Newest };

// seen[i][kv]: the keys query i sees (one query head per KV head, no prefill).
std::vector<std::vector<Positions>> composed_reference(int length, int n_kv, int heavy, const Pattern& pattern,
                                                       Scorer scorer, const Weight& weight) {
  std::vector<Positions> held(n_kv);
  std::vector<std::set<int>> heavy_set(n_kv);
  std::vector<std::map<int, double>> score(n_kv);  // per KV head: key -> h2o's sum or tova's last attention
  std::vector<std::vector<Positions>> seen(length, std::vector<Positions>(n_kv));
  for (int i = 0; i < length; ++i) {
    for (int kv = 0; kv < n_kv; ++kv) {
      held[kv].push_back(i);
      double sum = 0;
      for (int j : held[kv])
        if (j == i || heavy_set[kv].count(j) || pattern.attends(i, j)) {
          seen[i][kv].push_back(j);
          sum += weight(kv, i, j);
        }
      if (scorer == Scorer::TOVA) score[kv].clear();
      for (int j : seen[i][kv]) score[kv][j] += weight(kv, i, j) / sum;
    }
    for (int kv = 0; kv < n_kv; ++kv) {
      auto value = [&](int j) {
        if (scorer == Scorer::Newest) return static_cast<double>(j);
        if (scorer == Scorer::H2O) return score[kv].count(j) ? score[kv][j] : 0.0;
        double mean = 0;
        for (int other = 0; other < n_kv; ++other) mean += score[other].count(j) ? score[other][j] / n_kv : 0.0;
        return mean;
      };
      Positions candidates;
      for (int j : held[kv])
        if (!pattern.attends(i + 1, j)) candidates.push_back(j);
      std::sort(candidates.begin(), candidates.end(),
                [&](int a, int b) { return value(a) != value(b) ? value(a) > value(b) : a > b; });
      candidates.resize(std::min<size_t>(candidates.size(), heavy));
      heavy_set[kv] = std::set<int>(candidates.begin(), candidates.end());
      Positions kept;
      for (int j : held[kv])
        if (heavy_set[kv].count(j) || pattern.needed_later(i, j)) kept.push_back(j);
      held[kv] = kept;
    }
  }
  return seen;
}

}  // namespace

TEST_CASE("h2o+sparse-strided: each query sees its stride pattern plus h2o's two best other keys",
          "[policies][kept][compose]") {
  // Stride 3 over 10 tokens attends at most 5 earlier keys; a budget of 7 leaves 2 heavy
  // hitters. Key 1 gets 9 times any other key's weight: whenever the pattern does not
  // give a query key 1, h2o adds it.
  const SequenceShape shape = test::sequence_shape(10, 0, 2, 2);
  const Weight weight = [](int kv, int, int j) { return j == 1 + kv ? 9.0 : 1.0; };  // KV 1 favours key 2
  PolicyOptions o = token_budget(7);
  o.params.set("stride", 3);
  const test::LayerTrace trace = run(*make_policy("h2o+sparse-strided", o), shape, weight);
  const auto expected = composed_reference(10, 2, 2, strided(3), Scorer::H2O, weight);
  for (int i = 0; i < 10; ++i)
    for (int kv = 0; kv < 2; ++kv) {
      INFO("query " << i << " KV " << kv);
      CHECK(trace.seen[i][kv] == expected[i][kv]);
    }
  // By hand: query 6's pattern is 4, 5, 6 and 3, 0; the two heavy hitters come from
  // keys 1 and 2: both. Query 9's pattern is 7, 8, 9 and 6, 3, 0; KV 0 adds key 1 and
  // the better of 2, 4, 5.
  CHECK(trace.seen[6][0] == Positions{0, 1, 2, 3, 4, 5, 6});
  CHECK(std::count(trace.seen[9][0].begin(), trace.seen[9][0].end(), 1) == 1);
  CHECK(trace.seen[9][0].size() == 8u);
  CHECK(std::count(trace.seen[9][1].begin(), trace.seen[9][1].end(), 2) == 1);
}

TEST_CASE("tova+sparse-fixed: blocks, summaries and the layer's two best other cached keys",
          "[policies][kept][compose]") {
  // Blocks of 4 with 1 summary key over 12 tokens: at most 5 earlier keys, so a budget of
  // 7 leaves 2 heavy hitters, one decision for both KV heads. Key 1 (dropped by the
  // pattern once its block ends) has a large weight for KV 0, key 5 for KV 1.
  const SequenceShape shape = test::sequence_shape(12, 0, 2, 2);
  const Weight weight = [](int kv, int i, int j) { return j == (kv == 0 ? 1 : 5) ? 9.0 : 1.0 + (i + j) % 3; };
  PolicyOptions o = token_budget(7);
  o.params.set("stride", 4);
  const test::LayerTrace trace = run(*make_policy("tova+sparse-fixed", o), shape, weight);
  const auto expected = composed_reference(12, 2, 2, fixed(4, 1), Scorer::TOVA, weight);
  for (int i = 0; i < 12; ++i)
    for (int kv = 0; kv < 2; ++kv) {
      INFO("query " << i << " KV " << kv);
      CHECK(trace.seen[i][kv] == expected[i][kv]);
      CHECK(trace.seen[i][kv] == trace.seen[i][0]);  // one decision for the layer
    }
  // By hand: query 8 (block 8..11) sees itself and the summaries 3, 7 from the pattern;
  // key 1 survives as a heavy hitter.
  CHECK(std::count(trace.seen[8][0].begin(), trace.seen[8][0].end(), 1) == 1);
  CHECK(trace.seen[8][0].size() == 5u);
}

TEST_CASE("snapkv+sparse-fixed and h2o+sparse-fixed follow the same rule", "[policies][kept][compose]") {
  // snapkv with window 1 and kernel 1 scores the last query's attention per KV head: TOVA's
  // score without the layer average; with one KV head the two are the same.
  const SequenceShape shape = test::sequence_shape(12, 0);
  const Weight weight = [](int, int i, int j) { return 1.0 + (3 * i + 7 * j) % 5; };
  PolicyOptions o = token_budget(7);
  o.params.set("stride", 4);
  o.params.set("window", 1);
  o.params.set("kernel", 1);
  const test::LayerTrace snap = run(*make_policy("snapkv+sparse-fixed", o), shape, weight);
  const test::LayerTrace h2o = run(*make_policy("h2o+sparse-fixed", o), shape, weight);
  const auto last = composed_reference(12, 1, 2, fixed(4, 1), Scorer::TOVA, weight);
  const auto accumulated = composed_reference(12, 1, 2, fixed(4, 1), Scorer::H2O, weight);
  for (int i = 0; i < 12; ++i) {
    INFO("query " << i);
    CHECK(snap.seen[i][0] == last[i][0]);
    CHECK(h2o.seen[i][0] == accumulated[i][0]);
  }
  CHECK(last != accumulated);  // the two scores choose differently here
}

TEST_CASE("local and streamingllm on a pattern: the heavy slots go to the newest keys the pattern skips",
          "[policies][kept][compose]") {
  // On their own, local and streamingllm have no heavy part (their score, the position,
  // decides nothing there). On a pattern, the budget beyond the pattern is theirs: stride
  // 3, or blocks of 4 with 1 summary, over 12 tokens attends at most 5 earlier keys, and 7
  // tokens leave 2 heavy hitters, the newest keys outside query i's pattern.
  const SequenceShape shape = test::sequence_shape(12, 0);
  const Weight weight = [](int, int i, int j) { return 1.0 + (i * j) % 4; };
  PolicyOptions strided_options = token_budget(7);
  strided_options.params.set("stride", 3);
  const test::LayerTrace local = run(*make_policy("local+sparse-strided", strided_options), shape, weight);
  for (int i = 0; i < 12; ++i) {
    // The strided pattern holds every key: query i sees its pattern, itself and the two
    // newest keys j < i the pattern skips.
    Positions want, skipped;
    for (int j = 0; j <= i; ++j) (strided(3).attends(i, j) ? want : skipped).push_back(j);
    for (size_t k = skipped.size() >= 2 ? skipped.size() - 2 : 0; k < skipped.size(); ++k) want.push_back(skipped[k]);
    std::sort(want.begin(), want.end());
    INFO("local+sparse-strided query " << i);
    CHECK(local.seen[i][0] == want);
  }
  CHECK(local.seen[11][0] == Positions{2, 5, 6, 7, 8, 9, 10, 11});  // pattern 2, 5, 8..11; newest skipped 6, 7
  PolicyOptions fixed_options = token_budget(7);
  fixed_options.params.set("stride", 4);
  const test::LayerTrace streaming = run(*make_policy("streamingllm+sparse-fixed", fixed_options), shape, weight);
  const auto expected = composed_reference(12, 1, 2, fixed(4, 1), Scorer::Newest, weight);
  for (int i = 0; i < 12; ++i) {
    INFO("streamingllm+sparse-fixed query " << i);
    CHECK(streaming.seen[i][0] == expected[i][0]);
  }
  // By hand: query 8 (block 8..11) sees itself, the summaries 3 and 7, and the newest two
  // keys of the finished block, 5 and 6.
  CHECK(streaming.seen[8][0] == Positions{3, 5, 6, 7, 8});
}

// ---------------------------------------------------------------------------------
namespace {
// The causal softmax of row i of [T][T] logits over keys j <= i with keep[j], in double.
std::vector<double> softmax_row(const std::vector<float>& logits, int T, int i, const std::vector<char>& keep) {
  std::vector<double> p(i + 1, 0.0);
  double m = -1e300, sum = 0;
  for (int j = 0; j <= i; ++j)
    if (keep[j]) m = std::max(m, static_cast<double>(logits[static_cast<size_t>(i) * T + j]));
  for (int j = 0; j <= i; ++j)
    if (keep[j]) sum += (p[j] = std::exp(logits[static_cast<size_t>(i) * T + j] - m));
  for (double& x : p) x /= sum;
  return p;
}

// Each head's rows of a sim-only policy's output against the rows the test expects:
// zero exactly off the kept keys, the softmax over them elsewhere.
void check_rows(const std::vector<float>& probs, const std::vector<float>& logits, int T, int head,
                const std::vector<std::vector<char>>& keep) {
  const float* P = probs.data() + static_cast<size_t>(head) * T * T;
  const std::vector<float> L(logits.begin() + static_cast<size_t>(head) * T * T,
                             logits.begin() + static_cast<size_t>(head + 1) * T * T);
  for (int i = 0; i < T; ++i) {
    const std::vector<double> want = softmax_row(L, T, i, keep[i]);
    for (int j = 0; j < T; ++j) {
      INFO("head " << head << " row " << i << " key " << j);
      if (j > i || !keep[i][j]) {
        CHECK(P[static_cast<size_t>(i) * T + j] == 0.0f);
      } else {
        CHECK(P[static_cast<size_t>(i) * T + j] > 0.0f);
        CHECK(std::abs(P[static_cast<size_t>(i) * T + j] - want[j]) < 1e-6);
      }
    }
  }
}
}  // namespace

TEST_CASE("h2o-global keeps, in every row, the keys with the largest column sums and the recent band",
          "[policies][kept]") {
  // 10 tokens, heavy ratio .2 and recent ratio .2: 2 heavy keys per head for the whole
  // sequence, and each row's keys i-2..i. Logits are 0 but for:
  //   head 0: key 5 gets 3 in rows 5..9     -> column sums k5 3.72, k0 2.47, k1 1.47, ...
  //   head 1: key 3 gets 2 in rows 3..9, key 7 gets 4 in rows 7..9
  //                                         -> k3 2.83, k7 2.37, k0 2.22, ...
  const int T = 10;
  std::vector<float> logits(2 * T * T, 0.0f);
  auto at = [&](int h, int i, int j) -> float& { return logits[(static_cast<size_t>(h) * T + i) * T + j]; };
  for (int i = 5; i < T; ++i) at(0, i, 5) = 3;
  for (int i = 3; i < T; ++i) at(1, i, 3) = 2;
  for (int i = 7; i < T; ++i) at(1, i, 7) = 4;
  PolicyOptions o;
  o.budget.heavy_ratio = 0.2;
  o.budget.recent_ratio = 0.2;
  auto policy = make_policy("h2o-global", o);
  const SequenceShape shape = test::sequence_shape(T, 0, 2, 2);
  std::vector<float> probs(logits.size(), 0.0f);
  policy->as_sim_only()->simulate_layer(0, shape, T, logits.data(), probs.data());
  const std::vector<std::set<int>> heavy = {{0, 5}, {3, 7}};
  // The same heavy sets by brute force: the column sums of the unmasked softmax.
  for (int h = 0; h < 2; ++h) {
    std::vector<double> column(T, 0.0);
    const std::vector<float> L(logits.begin() + h * T * T, logits.begin() + (h + 1) * T * T);
    for (int i = 0; i < T; ++i) {
      const auto p = softmax_row(L, T, i, std::vector<char>(T, 1));
      for (int j = 0; j <= i; ++j) column[j] += p[j];
    }
    std::vector<int> order(T);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return column[a] > column[b]; });
    CHECK(std::set<int>(order.begin(), order.begin() + 2) == heavy[h]);
    std::vector<std::vector<char>> keep(T, std::vector<char>(T, 0));
    for (int i = 0; i < T; ++i)
      for (int j = 0; j <= i; ++j) keep[i][j] = heavy[h].count(j) || j >= i - 2;
    check_rows(probs, logits, T, h, keep);
  }
}

TEST_CASE("h2o-paper's masks follow its rule step by step on hand-made logits", "[policies][kept]") {
  // The rule (policies/h2o_paper.cpp, PROTOCOLS.md 1) in a few lines, per head: p_i the
  // unmasked softmax of row i; rows i < hb see all keys and add p_i to acc; row i >= hb
  // keeps the top hb-1 keys by acc (the lower index among equals) plus key i, acc
  // becomes acc + p_i on that set and 0 elsewhere, and the recent band i-rb..i is added.
  const int T = 16, n_q = 2;
  std::vector<float> logits(static_cast<size_t>(n_q) * T * T);
  for (int h = 0; h < n_q; ++h)
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j) logits[(static_cast<size_t>(h) * T + i) * T + j] = ((7 * h + 5 * j + 3 * i) % 11) / 3.0f;
  PolicyOptions o;
  o.budget.heavy_ratio = 0.25;  // hb 4
  o.budget.recent_ratio = 0.125;  // rb 2
  auto policy = make_policy("h2o-paper", o);
  const SequenceShape shape = test::sequence_shape(T, 0, n_q, n_q);
  std::vector<float> probs(logits.size(), 0.0f);
  policy->as_sim_only()->simulate_layer(0, shape, T, logits.data(), probs.data());
  const int hb = 4, rb = 2;
  for (int h = 0; h < n_q; ++h) {
    const std::vector<float> L(logits.begin() + h * T * T, logits.begin() + (h + 1) * T * T);
    std::vector<double> acc(T, 0.0);
    std::vector<std::vector<char>> keep(T, std::vector<char>(T, 0));
    Positions heavy_set = range(0, hb - 1);
    for (int i = 0; i < T; ++i) {
      const auto p = softmax_row(L, T, i, std::vector<char>(T, 1));
      if (i < hb) {
        for (int j = 0; j <= i; ++j) {
          keep[i][j] = 1;
          acc[j] += p[j];
        }
        continue;
      }
      Positions ranked = heavy_set;
      std::sort(ranked.begin(), ranked.end(), [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
      ranked.resize(hb - 1);
      ranked.push_back(i);
      std::vector<double> next(T, 0.0);
      for (int j : ranked) next[j] = acc[j] + p[j];
      acc = next;
      heavy_set = ranked;
      for (int j = 0; j <= i; ++j) keep[i][j] = std::count(ranked.begin(), ranked.end(), j) || j >= i - rb;
    }
    check_rows(probs, logits, T, h, keep);
  }
}

TEST_CASE("sparse-strided and sparse-fixed alone: a query sees its pattern, the cache what later queries need",
          "[policies][kept][compose]") {
  const SequenceShape shape = test::sequence_shape(13, 0, 2, 2);
  const Weight weight = [](int, int i, int j) { return 1.0 + (i + 2 * j) % 3; };
  for (const std::string name : {"sparse-strided", "sparse-fixed"}) {
    PolicyOptions o;
    o.params.set("stride", 4);
    const Pattern pattern = name == "sparse-strided" ? strided(4) : fixed(4, 1);
    const test::LayerTrace trace = run(*make_policy(name, o), shape, weight);
    for (int i = 0; i < 13; ++i)
      for (int kv = 0; kv < 2; ++kv) {
        Positions sees, cached;
        for (int j = 0; j <= i; ++j) {
          if (pattern.attends(i, j)) sees.push_back(j);
          if (pattern.needed_later(i, j)) cached.push_back(j);
        }
        INFO(name << " query " << i << " KV " << kv);
        CHECK(trace.seen[i][kv] == sees);
        CHECK(trace.positions[i][kv] == cached);
      }
  }
}

TEST_CASE("full keeps every token; every registered policy has its kept sets tested here", "[policies][kept]") {
  const SequenceShape shape = test::sequence_shape(10, 0, 2, 1);
  const test::LayerTrace trace = run(*make_policy("full", {}), shape, one_hot([](int i) { return i / 3; }));
  for (int i = 0; i < 10; ++i) CHECK(trace.positions[i][0] == range(0, i));
  // The cases above, by policy. A policy added to the registry changes this list, and
  // with it gets a case here that says which tokens it keeps (keydiff and lagkv, which
  // read the key and value vectors: in test_query_free_policies.cpp; expected-attention,
  // which reads the queries too: in test_expected_attention.cpp; kvzip, which reads its
  // pre-pass's table: in test_kvzip.cpp; duo-attention, which
  // needs a pattern file: in test_critical_duo.cpp).
  const std::vector<std::string> tested = {"full",      "local",       "random",       "h2o",    "h2o-paper",
                                           "h2o-global", "streamingllm", "tova",        "snapkv", "pyramidkv",
                                           "scissorhands", "knorm",     "keydiff",      "lagkv",  "expected-attention",
                                           "kvzip", "duo-attention", "sparse-strided", "sparse-fixed"};
  CHECK(policy_names() == tested);
}
