// The policy driver: the row protocol written once. Checked here without a model
// (synthetic logits): the softmax over the slots a query sees, the sliding window, the
// pattern masks, cache-row addressing with its row moves, lockstep and per-head
// scheduling on one and two threads, the statistics; and with the real model: a policy
// whose KV heads keep different numbers of slots runs the same in sim and decode mode.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "harness/model/model.h"
#include "harness/runtime/policy_driver.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

double logit(int h, int64_t i, int64_t j) {
  uint64_t x = (h + 1) * 0x9e3779b97f4a7c15ULL ^ (i + 3) * 0xbf58476d1ce4e5b9ULL ^ (j + 7) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 29;
  return 4.0 * static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53);
}

SequenceShape shape_of(int length, int n_q, int n_kv, int prefill = 0) {
  SequenceShape shape;
  shape.length = length;
  shape.prefill_len = prefill;
  shape.n_layers = 2;
  shape.n_q_heads = n_q;
  shape.n_kv_heads = n_kv;
  return shape;
}

// A policy whose KV heads keep different numbers of slots: head h keeps the newest
// (capacity - h) tokens. The real policies keep equal counts today; the driver and the
// cache must not depend on it.
class RaggedLocal : public RealisablePolicy {
 public:
  explicit RaggedLocal(int capacity) : RealisablePolicy(options(capacity)), capacity_(capacity) {}
  std::string name() const override { return "ragged-local"; }
  LayerStates make_layer_states(int, const SequenceShape& shape) const override {
    LayerStates states;
    for (int h = 0; h < shape.n_kv_heads; ++h) states.heads.push_back(std::make_unique<Head>(capacity_ - h));
    return states;
  }

 private:
  struct Head : LayerState {
    explicit Head(int keep) : keep_(keep) {}
    void append(int position, const NewToken&) override { positions_.push_back(position); }
    void merge(int position, const NewToken&) override { positions_.back() = position; }
    void observe(const float*) override {}
    bool compress(std::vector<int>* keep) override {
      const int n = static_cast<int>(positions_.size());
      if (n <= keep_) return false;
      keep->clear();
      for (int s = n - keep_; s < n; ++s) keep->push_back(s);
      positions_.erase(positions_.begin(), positions_.begin() + (n - keep_));
      return true;
    }
    const std::vector<int>& positions() const override { return positions_; }
    int keep_;
    std::vector<int> positions_;
  };
  static PolicyOptions options(int capacity) {
    PolicyOptions o;
    o.budget.tokens = capacity;
    return o;
  }
  int capacity_;
};

// Another policy's states, passed through, counting the observations they skip; with
// `every` they report no observation window, so the driver hands them every query.
class CountingSkips : public RealisablePolicy {
 public:
  CountingSkips(const RealisablePolicy& inner, bool every, int* skips)
      : RealisablePolicy(inner.options()), inner_(inner), every_(every), skips_(skips) {}
  std::string name() const override { return "counting+" + inner_.name(); }
  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    LayerStates states = inner_.make_layer_states(layer, shape);
    for (auto& head : states.heads) head = std::make_unique<Head>(std::move(head), every_, skips_);
    return states;
  }

 private:
  struct Head : LayerState {
    Head(std::unique_ptr<LayerState> inner, bool every, int* skips)
        : inner(std::move(inner)), every(every), skips(skips) {}
    void append(int position, const NewToken& token) override { inner->append(position, token); }
    void merge(int position, const NewToken& token) override { inner->merge(position, token); }
    void observe(const float* probs) override { inner->observe(probs); }
    int observation_window() const override { return every ? 0 : inner->observation_window(); }
    void skip_observation() override {
      ++*skips;
      inner->skip_observation();
    }
    bool compress(std::vector<int>* keep) override { return inner->compress(keep); }
    const std::vector<int>& positions() const override { return inner->positions(); }
    std::unique_ptr<LayerState> inner;
    bool every;
    int* skips;
  };
  const RealisablePolicy& inner_;
  bool every_;
  int* skips_;
};

// One run of a driver over `length` queries, one query at a time: the attention each
// query head gives each position (0 when not seen), per step. With CacheRows the test
// keeps its own row -> position map and applies the driver's moves to it, as a cache does.
struct DriverRun {
  std::vector<std::map<std::pair<int, int>, double>> attention;  // [step] (q head, position) -> probability
  std::vector<std::vector<int>> slots;                             // [step][kv]
};

DriverRun run_driver(const RealisablePolicy& policy, const SequenceShape& shape, int64_t window, SlotColumns columns) {
  PolicyDriver driver(policy, 0, shape, window, columns);
  const int n_q = shape.n_q_heads, n_kv = shape.n_kv_heads;
  std::vector<std::vector<int>> row_position(n_kv);  // CacheRows: [kv][row] -> position
  DriverRun run;
  for (int i = 0; i < shape.length; ++i) {
    int n = i + 1;
    if (columns == SlotColumns::CacheRows) {
      n = 0;
      for (int kv = 0; kv < n_kv; ++kv) {
        row_position[kv].resize(driver.slots(kv));
        row_position[kv].push_back(i);  // the new key goes to row slots(kv)
        n = std::max<int>(n, row_position[kv].size());
      }
    }
    std::vector<double> logits(static_cast<size_t>(n_q) * n, -1e300);  // never read where no key sits
    for (int h = 0; h < n_q; ++h)
      for (int c = 0; c < n; ++c) {
        const int kv = h / shape.group();
        int position = c;
        if (columns == SlotColumns::CacheRows) {
          if (c >= static_cast<int>(row_position[kv].size())) continue;
          position = row_position[kv][c];
        }
        logits[static_cast<size_t>(h) * n + c] = logit(h, i, position);
      }
    std::vector<float> norms(n_kv, 1.0f);
    driver.rows(i, 1, n, logits.data(), norms.data());
    std::map<std::pair<int, int>, double> step;
    for (int h = 0; h < n_q; ++h)
      for (int c = 0; c < n; ++c) {
        const double p = logits[static_cast<size_t>(h) * n + c];
        if (p == 0) continue;
        const int position = columns == SlotColumns::CacheRows ? row_position[h / shape.group()][c] : c;
        step[{h, position}] = p;
      }
    run.attention.push_back(step);
    for (const RowMove& m : driver.take_moves()) row_position[m.kv_head][m.to] = row_position[m.kv_head][m.from];
    std::vector<int> slots;
    for (int kv = 0; kv < n_kv; ++kv) slots.push_back(driver.slots(kv));
    run.slots.push_back(slots);
  }
  return run;
}

}  // namespace

TEST_CASE("the driver's attention is the softmax over the slots a query sees", "[driver]") {
  // local keeps the newest 6 tokens; query i sees them and itself.
  PolicyOptions o;
  o.budget.tokens = 6;
  auto local = make_policy("local", o);
  const SequenceShape shape = shape_of(20, 4, 2);
  const DriverRun run = run_driver(*local->as_realisable(), shape, 0, SlotColumns::Positions);
  for (int i = 0; i < shape.length; ++i)
    for (int h = 0; h < shape.n_q_heads; ++h) {
      const int first = std::max(0, i - 6);
      double sum = 0;
      for (int j = first; j <= i; ++j) sum += std::exp(logit(h, i, j) - 4.0);
      for (int j = 0; j <= i; ++j) {
        INFO("query " << i << " head " << h << " key " << j);
        const auto found = run.attention[i].find({h, j});
        const double expected = j >= first ? std::exp(logit(h, i, j) - 4.0) / sum : 0.0;
        const double got = found == run.attention[i].end() ? 0.0 : found->second;
        CHECK(std::abs(got - expected) < 1e-12);
      }
    }
}

TEST_CASE("the model's sliding window hides old slots from the query, not from the cache", "[driver]") {
  PolicyOptions o;
  o.budget.tokens = 10;
  auto local = make_policy("local", o);
  const SequenceShape shape = shape_of(25, 2, 2);
  const DriverRun run = run_driver(*local->as_realisable(), shape, 4, SlotColumns::Positions);
  for (int i = 0; i < shape.length; ++i) {
    std::vector<int> seen;
    for (const auto& [key, p] : run.attention[i])
      if (key.first == 0) seen.push_back(key.second);
    std::vector<int> expected;
    for (int j = std::max(0, i - 3); j <= i; ++j) expected.push_back(j);
    INFO("query " << i);
    CHECK(seen == expected);
    CHECK(run.slots[i][0] == std::min(i + 1, 10));  // the cache still holds the budget
  }
}

TEST_CASE("cache rows and positions give the same attention and the same slots, ragged heads included", "[driver]") {
  std::vector<std::unique_ptr<Policy>> policies;
  PolicyOptions o;
  o.budget.ratio = 0.3;
  o.params.set("window", 4);
  for (const std::string name : {"h2o", "tova", "snapkv", "scissorhands", "random", "knorm", "sparse-fixed",
                                 "h2o+sparse-strided", "tova+sparse-fixed"})
    policies.push_back(make_policy(name, o));
  policies.push_back(std::make_unique<RaggedLocal>(9));
  for (int prefill : {0, 17})
    for (const auto& policy : policies) {
      const SequenceShape shape = shape_of(48, 6, 3, prefill);
      INFO(policy->name() << " prefill " << prefill);
      const DriverRun by_position = run_driver(*policy->as_realisable(), shape, 0, SlotColumns::Positions);
      const DriverRun by_row = run_driver(*policy->as_realisable(), shape, 0, SlotColumns::CacheRows);
      CHECK(by_position.slots == by_row.slots);
      for (int i = 0; i < shape.length; ++i) {
        INFO("query " << i);
        REQUIRE(by_position.attention[i].size() == by_row.attention[i].size());
        for (const auto& [key, p] : by_position.attention[i]) {
          const auto found = by_row.attention[i].find(key);
          REQUIRE(found != by_row.attention[i].end());
          CHECK(found->second == p);
        }
      }
      // Evictions happened, so row moves were exercised (a strided pattern never drops a key).
      if (policy->name().find("sparse-strided") == std::string::npos) CHECK(by_row.slots.back()[0] < shape.length);
    }
  // The ragged heads really differ.
  const DriverRun ragged = run_driver(RaggedLocal(9), shape_of(30, 6, 3), 0, SlotColumns::CacheRows);
  CHECK(ragged.slots.back() == std::vector<int>({9, 8, 7}));
}

TEST_CASE("the driver gives the same numbers on one thread and on two, in blocks of any size", "[driver]") {
  const int threads = at::get_num_threads();
  PolicyOptions o;
  o.budget.ratio = 0.25;
  o.params.set("window", 6);
  const int T = 150, n_q = 8, n_kv = 4;
  auto at = [&](int h, int i, int j) { return (static_cast<size_t>(h) * T + i) * T + j; };
  for (const std::string name : {"h2o", "tova", "snapkv", "h2o+sparse-fixed"}) {
    auto policy = make_policy(name, o);
    const SequenceShape shape = shape_of(T, n_q, n_kv);
    std::vector<std::vector<float>> results;  // per run: [h][i][j], the attention of query i
    for (int run_threads : {1, 2})
      for (int block : {T, 16, 1}) {
        at::set_num_threads(run_threads);
        PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::Positions);
        std::vector<float> attention(static_cast<size_t>(n_q) * T * T, -1.0f);
        for (int first = 0; first < T; first += block) {
          const int rows = std::min(block, T - first), n = first + rows;
          std::vector<float> logits(static_cast<size_t>(n_q) * rows * n);
          for (int h = 0; h < n_q; ++h)
            for (int r = 0; r < rows; ++r)
              for (int j = 0; j < n; ++j)
                logits[(static_cast<size_t>(h) * rows + r) * n + j] = static_cast<float>(logit(h, first + r, j));
          std::vector<float> norms(static_cast<size_t>(rows) * n_kv);
          for (int r = 0; r < rows; ++r)
            for (int kv = 0; kv < n_kv; ++kv) norms[r * n_kv + kv] = 1.0f + static_cast<float>((first + r + kv) % 5);
          driver.rows(first, rows, n, logits.data(), norms.data());
          for (int h = 0; h < n_q; ++h)
            for (int r = 0; r < rows; ++r)
              for (int j = 0; j <= first + r; ++j)
                attention[at(h, first + r, j)] = logits[(static_cast<size_t>(h) * rows + r) * n + j];
        }
        results.push_back(attention);
      }
    at::set_num_threads(threads);
    INFO(name);
    for (size_t run = 1; run < results.size(); ++run) CHECK(results[run] == results[0]);
  }
}

TEST_CASE("the driver's statistics count slots while a query attends", "[driver]") {
  PolicyOptions o;
  o.budget.tokens = 5;
  auto local = make_policy("local", o);
  PolicyDriver driver(*local->as_realisable(), 0, shape_of(12, 4, 2), 0, SlotColumns::Positions);
  std::vector<float> norms(2, 1.0f);
  for (int i = 0; i < 12; ++i) {
    std::vector<float> logits(static_cast<size_t>(4) * (i + 1), 0.5f);
    driver.rows(i, 1, i + 1, logits.data(), norms.data());
  }
  CHECK(driver.peak_head_slots() == 6);   // the budget plus the newest token during its step
  CHECK(driver.peak_total_slots() == 12);  // over both KV heads
  CHECK(driver.max_slots() == 5);
  CHECK(driver.last_visible() == 6);
}

TEST_CASE("a policy whose KV heads keep different slot counts gives the same numbers in sim and decode mode",
          "[driver][sim-decode]") {
  ModelOptions options;
  options.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  const auto tokens = test::golden_tokens();
  for (int prefill : {0, 60}) {
    const RaggedLocal policy(30);
    const auto sim = score_sequence(*model, policy, Mode::Sim, tokens, prefill);
    const auto decode = score_sequence(*model, policy, Mode::Decode, tokens, prefill);
    INFO("prefill " << prefill);
    CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < 1e-9);
    CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
    CHECK(decode.kv.kept_per_head[0] == std::vector<int>({30, 29, 28, 27}));
    // Each head's own slots are held: 30 + 29 + 28 + 27 rows of the widest step, plus the
    // newest token per head.
    CHECK(decode.kv.peak_bytes == sim.kv.peak_bytes);
  }
}

TEST_CASE("heads that compress on threads of their own give the same row moves in head order", "[driver][moves]") {
  const int threads = at::get_num_threads();
  PolicyOptions o;
  o.budget.ratio = 0.2;
  const int T = 300, n_q = 8, n_kv = 8;
  for (const std::string name : {"h2o", "snapkv", "knorm"}) {
    auto policy = make_policy(name, o);
    const SequenceShape shape = shape_of(T, n_q, n_kv, T);  // the whole block is the prefill
    std::vector<std::vector<int>> runs;  // per run: (kv head, from, to) of each move, flattened
    for (int run_threads : {1, 2, 2, 2}) {
      at::set_num_threads(run_threads);
      PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::CacheRows);
      std::vector<float> logits(static_cast<size_t>(n_q) * T * T);
      for (int h = 0; h < n_q; ++h)
        for (int r = 0; r < T; ++r)
          for (int j = 0; j < T; ++j) logits[(static_cast<size_t>(h) * T + r) * T + j] = static_cast<float>(logit(h, r, j));
      std::vector<float> norms(static_cast<size_t>(T) * n_kv);
      for (int r = 0; r < T; ++r)
        for (int kv = 0; kv < n_kv; ++kv) norms[r * n_kv + kv] = 1.0f + static_cast<float>((r * 7 + kv) % 11);
      driver.rows(0, T, T, logits.data(), norms.data());
      std::vector<int> moves;
      for (const RowMove& m : driver.take_moves()) moves.insert(moves.end(), {m.kv_head, m.from, m.to});
      runs.push_back(moves);
    }
    at::set_num_threads(threads);
    INFO(name);
    REQUIRE(!runs[0].empty());
    for (size_t m = 3; m < runs[0].size(); m += 3) CHECK(runs[0][m - 3] <= runs[0][m]);  // head order
    for (size_t run = 1; run < runs.size(); ++run) CHECK(runs[run] == runs[0]);
  }
}

TEST_CASE("DMC merges through the driver: the newest slot takes the key, or a new one when it was evicted", "[driver][dmc]") {
  // knorm keeps the 2 lowest key norms (no recent window). A merge renews the newest
  // slot's position and norm; when knorm has evicted that slot, the key enters as a new one.
  PolicyOptions o;
  o.budget.tokens = 2;
  auto knorm = make_policy("knorm", o);
  PolicyDriver driver(*knorm->as_realisable(), 0, shape_of(10, 1, 1), 0, SlotColumns::Versions);
  const std::vector<uint8_t> merges = {0, 0, 1, 0, 1, 1, 0, 1, 0, 1};
  const std::vector<float> norms = {1, 2, 5, 3, 1.5, 9, 0.5, 7, 8, 0.1};
  // Step 2's merge gives position 2 norm 5, so step 3 evicts it, not position 3 (norm 3).
  // Step 8's key (norm 8) is evicted at once, so step 9's merge finds position 7 newest
  // and enters as a new slot.
  const std::vector<std::vector<int>> positions = {{0},    {0, 1}, {0, 2}, {0, 3}, {0, 4},
                                                   {0, 5}, {0, 6}, {0, 7}, {0, 7}, {0, 9}};
  const std::vector<std::vector<int>> columns = {{0},    {0, 1}, {0, 2}, {0, 2}, {0, 2},
                                                 {0, 2}, {0, 2}, {0, 2}, {0, 1}, {0, 2}};
  for (int i = 0; i < 10; ++i) {
    INFO("step " << i);
    driver.start_block(i);
    const int n = driver.slots(0) + 1;  // the slots, then this step's key
    std::vector<double> logits(n, 0.5);
    driver.rows(i, 1, n, logits.data(), &norms[i], nullptr, &merges[i]);
    CHECK(driver.state(0).positions() == positions[i]);
    CHECK(driver.columns(0) == columns[i]);
    double sum = 0;
    for (double p : logits) sum += p;
    CHECK(std::abs(sum - 1.0) < 1e-12);
  }
  // Merges are only read over version columns.
  PolicyDriver by_rows(*knorm->as_realisable(), 0, shape_of(10, 1, 1), 0, SlotColumns::CacheRows);
  std::vector<double> logits(1, 0.0);
  CHECK_THROWS(by_rows.rows(0, 1, 1, logits.data(), &norms[0], nullptr, &merges[0]));
}

TEST_CASE("a policy that reads only its last observations skips the older ones with the same kept slots",
          "[driver][observation-window]") {
  // snapkv reads the ring of its last `window` observations: in a prefill of 40 queries the
  // first 40 - 8 need not be observed at all. Driven with and without the skips, over
  // positions and over cache rows, the kept slots and every attention are the same at
  // every query, through the compression at the prefill's end and the steps after it.
  PolicyOptions o;
  o.budget.tokens = 12;
  o.params.set("window", 8);
  const auto snapkv = make_policy("snapkv", o);
  for (const SequenceShape& shape : {shape_of(60, 2, 2, 40), shape_of(60, 4, 2, 40)}) {
    int skipped = 0, never = 0;
    const CountingSkips skipping(*snapkv->as_realisable(), false, &skipped);
    const CountingSkips every(*snapkv->as_realisable(), true, &never);
    for (SlotColumns columns : {SlotColumns::Positions, SlotColumns::CacheRows}) {
      const DriverRun a = run_driver(skipping, shape, 0, columns);
      const DriverRun b = run_driver(every, shape, 0, columns);
      CHECK(a.slots == b.slots);
      CHECK(a.attention == b.attention);
      CHECK(a.slots.back() == std::vector<int>(2, 12));
    }
    CHECK(skipped == 2 * 2 * (40 - 8));  // two runs of two KV heads, queries 0 .. 31
    CHECK(never == 0);
  }
}
