// KIVI KV-cache quantization: the quantizer and packing on hand-made groups, the flush
// schedule and byte counts of one head's store (model-free), the golden of
// tools/ref_kivi.py in both modes, R = T against the unquantized cache, and sim == decode
// for every realisable policy with a quantized cache.

#include <random>
#include <set>

#include "harness/common/errors.h"
#include "harness/common/kv_quant.h"
#include "harness/config/sweep_grid.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::error_of;

namespace {

using test::max_diff;

KvQuantSpec kivi(int bits, int group, int residual) {
  KvQuantSpec spec;
  spec.bits = bits;
  spec.group = group;
  spec.residual = residual;
  return spec;
}

// A store of one head fed `length` random tokens (position i: key and value drawn from a
// seeded normal), each followed by the schedule as a stream (prefill 0) or a prefill of
// `prefill` tokens.
struct Fed {
  KvHeadStore<double> store;
  std::vector<std::vector<double>> keys, values;  // [length][d]
};
Fed feed(const KvQuantSpec& spec, int d, int length, int prefill, uint64_t seed = 7) {
  Fed fed{KvHeadStore<double>(spec, d), {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int i = 0; i < length; ++i) {
    std::vector<double> k(d), v(d);
    for (double& x : k) x = normal(rng);
    for (double& x : v) x = normal(rng);
    fed.store.append(i, k.data(), v.data());
    fed.keys.push_back(k);
    fed.values.push_back(v);
    fed.store.after_attention(i, prefill);
  }
  return fed;
}

}  // namespace

TEST_CASE("the KIVI quantizer on hand-made groups", "[kivi]") {
  uint8_t codes[8];
  SECTION("an exact grid, 2 bits") {
    const double x[] = {0, 1, 2, 3};
    auto p = quantize_group(x, 4, 1, 2, codes);
    CHECK(p.min == 0);
    CHECK(p.scale == 1);
    for (int i = 0; i < 4; ++i) CHECK(codes[i] == i);
  }
  SECTION("ties at .5 round to even, 2 bits") {
    const double x[] = {0, 0.5, 1.5, 2.5, 3};  // s = 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
    quantize_group(x, 5, 1, 2, codes);
    CHECK(std::vector<int>(codes, codes + 5) == std::vector<int>{0, 0, 2, 2, 3});
  }
  SECTION("ties at .5 round to even, 4 bits, with a stride") {
    const double x[] = {0, 99, 6.5, 99, 7.5, 99, 15, 99};  // every other element; s = 1
    auto p = quantize_group(x, 4, 2, 4, codes);
    CHECK(p.scale == 1);
    CHECK(std::vector<int>(codes, codes + 4) == std::vector<int>{0, 6, 8, 15});
    CHECK(dequantize<double>(codes[2], p) == 8);
  }
  SECTION("a constant group dequantizes to its min") {
    const float x[] = {2.5f, 2.5f, 2.5f};
    auto p = quantize_group(x, 3, 1, 2, codes);
    CHECK(p.scale == 0);
    for (int i = 0; i < 3; ++i) CHECK(dequantize<float>(codes[i], p) == 2.5f);
  }
  SECTION("dequantized values lie within half a step, ends exact") {
    const double x[] = {-1.25, 0.3, 0.71, 2.0, -0.4, 1.9};
    for (int bits : {2, 4}) {
      auto p = quantize_group(x, 6, 1, bits, codes);
      for (int i = 0; i < 6; ++i) CHECK(std::abs(dequantize<double>(codes[i], p) - x[i]) <= p.scale / 2 + 1e-15);
      CHECK(dequantize<double>(codes[0], p) == -1.25);
      CHECK(std::abs(dequantize<double>(codes[3], p) - 2.0) < 1e-15);
    }
  }
}

TEST_CASE("KIVI packs codes at their bits and unpacks them unchanged", "[kivi]") {
  const uint8_t four[] = {1, 2, 3, 0};
  uint8_t packed[4];
  pack_codes(four, 4, 2, packed);
  CHECK(packed_bytes(4, 2) == 1);
  CHECK(packed[0] == (1 | 2 << 2 | 3 << 4));
  pack_codes(four, 4, 4, packed);
  CHECK(packed_bytes(4, 4) == 2);
  CHECK(packed[0] == (1 | 2 << 4));
  CHECK(packed[1] == 3);
  std::mt19937 rng(3);
  for (int bits : {2, 4})
    for (int n : {1, 3, 8, 13, 64}) {
      std::vector<uint8_t> codes(n), back(n), bytes(packed_bytes(n, bits));
      for (auto& c : codes) c = static_cast<uint8_t>(rng() % (1u << bits));
      pack_codes(codes.data(), n, bits, bytes.data());
      unpack_codes(bytes.data(), n, bits, back.data());
      INFO("bits " << bits << " n " << n);
      CHECK(back == codes);
    }
}

TEST_CASE("the KIVI flush schedule at L = R-1, R, R+1, 2R+5", "[kivi]") {
  const int G = 4, R = 8, d = 8;
  for (int bits : {2, 4})
    for (int L : {R - 1, R, R + 1, 2 * R + 5})
      for (int prefill : {0, L}) {
        const Fed fed = feed(kivi(bits, G, R), d, L, prefill);
        const KvHeadStore<double>& s = fed.store;
        INFO("bits " << bits << " L " << L << " prefill " << prefill);
        // Stream: the key residual empties at every R tokens; prefill: r = L mod R stay.
        CHECK(s.key_residual_tokens() == L % R);
        CHECK(s.key_blocks() == (L - L % R) / G);
        CHECK(s.value_residual_tokens() == std::min(L, R));
        CHECK(s.tokens() == L);
        // Residual tokens read back exactly; quantized ones within half a group's step.
        std::vector<double> k(d), v(d);
        for (int i = 0; i < L; ++i) {
          s.read(i, k.data(), v.data());
          const bool key_quantized = i < L - L % R, value_quantized = i < L - std::min(L, R);
          for (int c = 0; c < d; ++c) {
            if (!key_quantized) CHECK(k[c] == fed.keys[i][c]);
            if (!value_quantized) CHECK(v[c] == fed.values[i][c]);
          }
          if (key_quantized) {
            // the key group: tokens of i's block, channel 0
            const int b0 = i / G * G;
            double lo = 1e9, hi = -1e9;
            for (int j = b0; j < b0 + G; ++j) lo = std::min(lo, fed.keys[j][0]), hi = std::max(hi, fed.keys[j][0]);
            CHECK(std::abs(k[0] - fed.keys[i][0]) <= (hi - lo) / ((1 << bits) - 1) / 2 + 1e-12);
          }
        }
        // Quantization changed some key (the group's min and max come back exact).
        int changed = 0;
        for (int i = 0; i < L - L % R; ++i) {
          s.read(i, k.data(), v.data());
          for (int c = 0; c < d; ++c) changed += k[c] != fed.keys[i][c];
        }
        if (L >= R) CHECK(changed > 0);
        // The bulk read the cache uses gives what read() gives.
        std::vector<int> row_of(L);
        for (int i = 0; i < L; ++i) row_of[i] = L - 1 - i;  // any row order
        std::vector<double> all_keys(static_cast<size_t>(L) * d), all_values(static_cast<size_t>(L) * d);
        s.dequantize_all(row_of, all_keys.data(), all_values.data());
        for (int i = 0; i < L; ++i) {
          s.read(i, k.data(), v.data());
          CHECK(std::equal(k.begin(), k.end(), all_keys.begin() + static_cast<size_t>(L - 1 - i) * d));
          CHECK(std::equal(v.begin(), v.end(), all_values.begin() + static_cast<size_t>(L - 1 - i) * d));
        }
        // Bytes: codes at b bits, a scale and a min per group, residual elements at fp16.
        const KvByteCount c = s.count();
        const int64_t kq = L - L % R, vq = L - std::min(L, R);
        CHECK(c.bytes() * 8 == (kq + vq) * d * bits + (kq / G * d + vq * (d / G)) * 32 +
                                   (L % R + std::min(L, R)) * d * 16);
      }
  // The schedule before the prefill's end does nothing; a prefill below R is the stream.
  const Fed inside = feed(kivi(2, G, R), d, 2 * R + 5, 100);
  CHECK(inside.store.key_residual_tokens() == 2 * R + 5);
  CHECK(inside.store.value_residual_tokens() == 2 * R + 5);
}

TEST_CASE("KIVI eviction: groups keep their scale and min until all their tokens leave", "[kivi]") {
  const int G = 4, R = 8, d = 8;
  Fed fed = feed(kivi(2, G, R), d, 2 * R + 3, 0);  // keys: 4 blocks quantized, 3 in the residual
  KvHeadStore<double>& s = fed.store;
  std::vector<double> before(d), after(d), v(d);
  s.read(5, before.data(), v.data());
  // Evict token 4 (block 1 keeps 5..7), all of block 0 (0..3), and residual token 17.
  std::vector<int> kept;
  for (int i = 5; i < 2 * R + 3; ++i)
    if (i != 17) kept.push_back(i);
  const int64_t groups_before = s.count().key_groups;
  s.retain(kept);
  CHECK(s.tokens() == static_cast<int>(kept.size()));
  CHECK(s.key_blocks() == 3);
  CHECK(s.count().key_groups == groups_before - d);
  CHECK(s.key_residual_tokens() == 2);
  s.read(5, after.data(), v.data());
  CHECK(after == before);  // its block kept m and s
  CHECK_THROWS_AS(s.read(4, after.data(), v.data()), Error);
  // The schedule goes on over the kept tokens: 6 more make the residual R again.
  for (int i = 2 * R + 3; i < 2 * R + 9; ++i) {
    s.append(i, fed.keys[0].data(), fed.values[0].data());
    s.after_attention(i, 0);
  }
  CHECK(s.key_residual_tokens() == 0);
  CHECK(s.key_blocks() == 5);
  // held_bytes counts the packed codes: far below the doubles they replace.
  CHECK(s.held_bytes() < static_cast<int64_t>(s.tokens()) * 2 * d * sizeof(double));
}

TEST_CASE("KIVI settings are checked with one-line errors naming the flag", "[kivi][errors]") {
  CHECK(error_of([] { check_kv_quant_spec(kivi(3, 8, 16)); }).find("--kv-bits") == 0);
  CHECK(error_of([] { check_kv_quant_spec(kivi(2, 8, 12)); }).find("--kv-residual") == 0);
  CHECK(error_of([] { check_kv_quant_spec(kivi(2, 0, 16)); }).find("--kv-group") == 0);
  CHECK(error_of([] { check_kv_quant_head_dim(kivi(2, 3, 12), 8); }).find("--kv-group 3 does not divide") == 0);
  KvQuantSpec memory = kivi(2, 8, 16);
  memory.memory = 1.5;
  CHECK(error_of([&] { check_kv_quant_spec(memory); }).find("--kv-memory") == 0);
  memory.memory = 0;
  CHECK(error_of([&] { check_kv_quant_spec(memory); }).find("--kv-memory") == 0);
  CHECK(error_of([&] { check_kv_quant_spec(kivi(16, 8, 16)); }).empty());
}

TEST_CASE("KIVI sweep keys make cells with their own identity", "[kivi][sweep]") {
  nlohmann::json config = {{"tasks", {"copa"}},           {"policies", {"full", "h2o", "h2o-paper"}},
                           {"kv_quant", "kivi"},           {"kv_bits", {16, 2}},
                           {"kv_group", 8},                {"kv_residual", 16},
                           {"kv_memories", {0.25, 0.5}}};
  // A byte budget counts a cache's bytes: a sim-only policy holds no cache.
  CHECK_THAT(error_of([&] { expand_sweep(config, "equal.json", test::data("")); }),
             Catch::Contains("\"kv_memories\"") && Catch::Contains("h2o-paper"));
  config["policies"] = {"full", "h2o"};
  const SweepPlan plan = expand_sweep(config, "equal.json", test::data(""));
  // full x {16, 2}; h2o x {16, 2} x 2 memories.
  CHECK(plan.cells.size() == 2 + 4);
  std::set<std::string> keys;
  for (const SweepCell& cell : plan.cells) {
    keys.insert(cell.key());
    const KvQuantSpec& q = cell.eval.policy_options.kv_quant;
    CHECK((q.bits == 16 || q.bits == 2));
    if (cell.eval.policy != "full") CHECK((q.memory == 0.25 || q.memory == 0.5));
    const ResultRow row = identity_row(cell.model, cell.eval);
    CHECK(row.kv_bits == q.bits);
    CHECK(row.kv_group.has_value() == (q.bits != 16));
  }
  CHECK(keys.size() == plan.cells.size());
  CHECK(plan.skipped.empty());
  config["kv_bits"] = {3};
  CHECK(error_of([&] { expand_sweep(config, "equal.json", test::data("")); }).find("kv_bits") != std::string::npos);
  config["kv_bits"] = {2};
  config["kv_residual"] = 12;
  CHECK(error_of([&] { expand_sweep(config, "equal.json", test::data("")); }).find("kv_residual") != std::string::npos);
}

TEST_CASE("a --kv-memory bound picks the token budget that fits the bytes", "[kivi]") {
  KvQuantSpec plain;
  // 16 bits: the fp16 cache, so a quarter of the bytes is a quarter of the tokens.
  CHECK(tokens_for_memory(plain, 0.25, 1000, 64) == 250);
  KvQuantSpec four = kivi(4, 32, 128);
  const int64_t kept = tokens_for_memory(four, 0.25, 4096, 64);
  // 70% at 4 bits, against 256 bytes a token at fp16 (F = 0.25: 262144 bytes). Worst case
  // with t tokens kept of 4096: keys (t - 128)·32 in codes + 128 groups alive ·64 channels
  // ·4 + 128 residual ·128; values (t - 129)·(32 + 2 groups·4) + 129·128. That is
  // 72t + 56408 bytes, so t = 2857.
  CHECK(kept == 2857);
  CHECK(kv_bytes_bound(four, kept, 64, 4096) <= full_precision_bytes(4096, 64) / 4);
  CHECK(kv_bytes_bound(four, kept + 1, 64, 4096) > full_precision_bytes(4096, 64) / 4);
  // Whichever tokens a policy keeps, the decode cache then holds no more bytes than the
  // budget, per layer and KV head: a window's contiguous kept set and the scattered ones of
  // scored and random policies, whose kept keys can each hold a group's scale and min alive.
  for (const char* name : {"local", "h2o", "tova", "snapkv", "random", "streamingllm"}) {
    for (int bits : {2, 4}) {
      PolicyOptions o;
      o.kv_quant = kivi(bits, 8, 16);
      o.kv_quant.memory = 0.25;
      auto policy = make_policy(name, o);
      SequenceShape shape;
      shape.length = 200;
      shape.head_dim = 8;
      INFO(name << " at " << bits << " bits");
      CHECK(policy->layer_budget(0, shape).capacity == tokens_for_memory(o.kv_quant, 0.25, 200, 8) - 1);
      auto score = score_sequence(test::stories(), *policy, Mode::Decode, test::golden_tokens());
      const int64_t layers = 5, kv_heads = 4;
      CHECK(score.kv.peak_bytes > 0);
      CHECK(score.kv.peak_bytes <= layers * kv_heads * full_precision_bytes(200, 8) / 4);
    }
  }
}

TEST_CASE("KIVI reproduces tools/ref_kivi.py's golden in both modes", "[kivi][golden]") {
  const auto golden = test::read_json(test::data("golden/kivi_stories260K_T200.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const int layers = golden["model_shape"]["layers"].get<int>();
  for (const auto& [dtype, tolerance] : std::vector<std::pair<std::string, double>>{{"float64", 1e-6}, {"float32", 1e-4}}) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    for (const auto& config : golden["configs"]) {
      const auto& spec = config["spec"];
      PolicyOptions o;
      o.kv_quant = kivi(spec["bits"].get<int>(), spec["group_size"].get<int>(), spec["residual_length"].get<int>());
      std::string policy_name = "full";
      if (spec["eviction"].is_object()) {
        policy_name = spec["eviction"]["policy"].get<std::string>();
        o.budget.tokens = spec["eviction"]["B"].get<int>();
      }
      const int prefill = spec["prompt_len"].is_null() ? 0 : spec["prompt_len"].get<int>();
      auto policy = make_policy(policy_name, o);
      const auto want = config["next_token_logprob"].get<std::vector<double>>();
      for (Mode mode : {Mode::Sim, Mode::Decode}) {
        auto score = score_sequence(*model, *policy, mode, tokens, prefill);
        INFO(config["name"].get<std::string>() << " " << dtype << " " << mode_name(mode));
        double mean = 0;
        for (double lp : score.next_token_logprob) mean -= lp / score.next_token_logprob.size();
        if (dtype == "float64") {
          const double worst = max_diff(score.next_token_logprob, want);
          INFO("max diff " << worst);
          CHECK(worst < tolerance);
        }
        INFO("mean NLL " << mean << " golden " << config["mean_nll"].get<double>());
        CHECK(std::abs(mean - config["mean_nll"].get<double>()) < 1e-4);
        const double peak = config["memory_per_layer"]["peak_at_attention"]["bytes"].get<double>();
        CHECK(score.kv.peak_bytes == static_cast<int64_t>(peak) * layers);
        CHECK(score.kv.kv_bits == spec["bits"].get<int>());
      }
    }
  }
}

TEST_CASE("KIVI with R = T reproduces the unquantized cache", "[kivi]") {
  const std::vector<int> tokens = test::golden_tokens();
  const int T = static_cast<int>(tokens.size());
  // float64: the unquantized full cache takes the sequence as one block and the quantized
  // one token by token, so their projections round differently (~1e-14); nothing is
  // quantized, so anything else would show far above 1e-12.
  ModelOptions options = test::model_options();
  options.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  for (const std::string& name : {"full", "h2o", "local"}) {
    PolicyOptions plain;
    if (name != "full") plain.budget.ratio = 0.3;
    PolicyOptions quantized = plain;
    quantized.kv_quant = kivi(2, 8, (T + 7) / 8 * 8);  // a residual no step fills
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      auto want = score_sequence(*model, *make_policy(name, plain), Mode::Decode, tokens);
      auto got = score_sequence(*model, *make_policy(name, quantized), mode, tokens);
      const double worst = max_diff(got.next_token_logprob, want.next_token_logprob);
      INFO(name << " " << mode_name(mode) << " max diff " << worst);
      CHECK(worst < 1e-12);
      CHECK(got.kv.kept_per_layer == want.kv.kept_per_layer);
      CHECK(got.kv.peak_bytes == got.kv.peak_bytes_full);
    }
  }
}

TEST_CASE("sim mode and decode mode agree for every realisable policy with a KIVI cache", "[kivi][sim-decode]") {
  const std::vector<int> tokens = test::golden_tokens();
  ModelOptions options = test::model_options();
  options.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  for (const std::string& name : policy_names()) {
    PolicyOptions probe;
    probe.budget.ratio = 0.5;
    if (!make_policy(name, probe)->realisable()) {
      PolicyOptions o = probe;
      o.kv_quant = kivi(2, 8, 16);
      INFO(name);
      CHECK(error_of([&] { score_sequence(*model, *make_policy(name, o), Mode::Sim, tokens); })
                .find("is sim-only: it cannot run with --kv-quant kivi") != std::string::npos);
      continue;
    }
    // Each budget with one width, for half the time: sim and decode meet the same quantized
    // store at either (both packings are checked above).
    for (const auto& [budget, bits] : std::vector<std::pair<double, int>>{{0.2, 2}, {0.5, 4}})
      for (int prefill : {0, 100}) {
        if (prefill == 0 && test::needs_prepass(name)) continue;  // it needs a prefill
        PolicyOptions o;
        o.budget.ratio = budget;
        o.params.set("window", 8);
        o.kv_quant = kivi(bits, 8, 16);
        auto policy = make_policy(name, test::runnable_on(name, *model, o));
        auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
        auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
        INFO(name << " budget " << budget << " prefill " << prefill << " bits " << bits);
        CHECK(max_diff(sim.next_token_logprob, decode.next_token_logprob) < 1e-9);
        CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
        CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
        CHECK(sim.kv.peak_bytes == decode.kv.peak_bytes);
        CHECK(sim.kv.peak_bytes_full == decode.kv.peak_bytes_full);
        CHECK(sim.kv.peak_bytes < sim.kv.peak_bytes_full);
      }
  }
}
