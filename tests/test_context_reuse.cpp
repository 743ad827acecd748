// Shared-context reuse for multiple choice (issue 31): a document's choices run their
// common context once and continue a fork of its cache. Every choice's numbers must equal
// the same request alone, bit for bit: the calls are the same ones. Each case also checks
// that reuse happened (or, where it must not, that it did not), so a harness that silently
// stopped reusing fails.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/joint_request.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::tokens_of;

namespace {

// One document: a 14-token context and three continuations of 5, 9 and 5 tokens (two of
// equal length, so policies that need equal lengths still have a pair to share), as eval
// prepares them under `protocol`.
std::vector<ScoreRequest> document(const Model& model, Protocol protocol, int context_len = 14) {
  const int vocab = static_cast<int>(model.arch().vocab);
  const std::vector<int> context = tokens_of(context_len, 3, vocab);
  std::vector<ScoreRequest> requests;
  int seed = 40;
  for (int n_cont : {5, 9, 5}) {
    std::vector<int> whole = context;
    for (int t : tokens_of(n_cont, seed++, vocab)) whole.push_back(t);
    requests.push_back(joint_score_request(model, protocol, whole, context_len, 0));
  }
  return requests;
}

std::vector<SequenceScore> alone(const Model& model, const Policy& policy, Mode mode,
                                 const std::vector<ScoreRequest>& requests) {
  std::vector<SequenceScore> out;
  for (const ScoreRequest& r : requests)
    out.push_back(score_sequence(model, policy, mode, r.tokens, r.prefill_len, r.budget_length, r.final_target,
                                 r.first_logprob, r.top_k));
  return out;
}

// Within 1e-5 (float32); with `exact`, bit for bit.
void check_same(const std::vector<SequenceScore>& a, const std::vector<SequenceScore>& b, bool exact) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("request " << i);
    CHECK(test::max_diff(a[i].next_token_logprob, b[i].next_token_logprob) <= 1e-5);
    if (exact) CHECK(a[i].next_token_logprob == b[i].next_token_logprob);
    CHECK(a[i].argmax == b[i].argmax);
    CHECK(a[i].kv.kept_per_head == b[i].kv.kept_per_head);
    CHECK(a[i].kv.max_per_layer == b[i].kv.max_per_layer);
    CHECK(a[i].kv.peak_bytes == b[i].kv.peak_bytes);
  }
}

PolicyOptions token_budget(int tokens) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  return o;
}

PolicyOptions ratio_budget(double ratio) {
  PolicyOptions o;
  o.budget.ratio = ratio;
  return o;
}

// A policy whose states cannot be cloned (LayerState::clone's default): the recent window.
class NoCloneState : public LayerState {
 public:
  explicit NoCloneState(int capacity) : capacity_(capacity) {}
  void append(int position, const NewToken&) override { positions_.push_back(position); }
  void merge(int position, const NewToken&) override { positions_.back() = position; }
  void observe(const float*) override {}
  bool compress(std::vector<int>* keep) override {
    const int n = size();
    if (n <= capacity_) return false;
    positions_.erase(positions_.begin(), positions_.begin() + (n - capacity_));
    if (keep) {
      keep->clear();
      for (int s = n - capacity_; s < n; ++s) keep->push_back(s);
    }
    return true;
  }
  const std::vector<int>& positions() const override { return positions_; }

 private:
  int capacity_;
  std::vector<int> positions_;
};

class NoClonePolicy : public RealisablePolicy {
 public:
  NoClonePolicy() : RealisablePolicy(token_budget(6)) {}
  std::string name() const override { return "no-clone-window"; }
  LayerStates make_layer_states(int, const SequenceShape& shape) const override {
    LayerStates states;
    for (int h = 0; h < shape.n_kv_heads; ++h) states.heads.push_back(std::make_unique<NoCloneState>(6));
    return states;
  }
};

}  // namespace

TEST_CASE("every realisable policy in decode mode: choices continuing a shared context equal each alone",
          "[reuse]") {
  const Model& model = test::stories();
  int policies_run = 0;
  std::vector<std::string> names;
  for (const std::string& name : policy_names()) names.push_back(name);
  for (const std::string name :
       {"ada+h2o", "ada+snapkv", "h2o+sparse-strided", "tova+sparse-fixed", "decoding+h2o", "block+h2o", "think+h2o",
        "cam+h2o"})
    names.push_back(name);
  for (const std::string& name : names) {
    if (!make_policy(name, name == reference_policy_name() ? PolicyOptions{} : token_budget(9))->realisable()) continue;
    // A policy that rewrites kept slots refuses KIVI; ThinK prunes at a prefill's end, which stream has not.
    const bool rewrites =
        make_policy(name, name == reference_policy_name() ? PolicyOptions{} : token_budget(9))->as_realisable()->rewrites_slots();
    for (const bool kivi : {false, true}) {
      for (const Protocol protocol : {Protocol::Stream, Protocol::PrefillCompress}) {
        if ((rewrites && kivi) || (name == "think+h2o" && protocol == Protocol::Stream)) continue;
        if (protocol == Protocol::Stream && test::needs_prepass(name)) continue;  // it needs a prefill
        const bool is_full = name == reference_policy_name();
        // A token budget under stream (the same for every choice), a ratio of the shared
        // context under prefill-compress (also the same for every choice).
        PolicyOptions options = is_full ? PolicyOptions{} : protocol == Protocol::Stream ? token_budget(9)
                                                                                           : ratio_budget(0.5);
        // block+: blocks shorter than the shared context; decoding+: several compressions in
        // the choices, and under stream no budget (it would compress a prefill there is not).
        if (name == "block+h2o") options.params.set("block_size", 5);
        if (name == "decoding+h2o") {
          options.params.set("decode_interval", 3);
          options.params.set("decode_target", 6);
          if (protocol == Protocol::Stream) options.budget = {};
        }
        if (kivi) {
          options.kv_quant.bits = 2;
          options.kv_quant.group = 4;
          options.kv_quant.residual = 8;
        }
        auto policy = make_policy(name, test::runnable_on(name, model, options));
        INFO("policy " << name << (kivi ? " kivi" : "") << " protocol " << protocol_name(protocol));
        const auto requests = document(model, protocol);
        const auto one_by_one = alone(model, *policy, Mode::Decode, requests);
        int64_t saved = 0;
        const auto shared = score_shared_context(model, *policy, Mode::Decode, requests, true, &saved);
        check_same(shared, one_by_one, true);
        // Every choice but the first continued the context (stream: its 14 one-token steps;
        // prefill-compress: the prefill block, block+h2o's three blocks of at most 5); a
        // pattern sized to the length shares only
        // between the two choices of equal length. The full cache without KIVI runs each
        // request as one block: no call is shared.
        const bool equal_lengths_only =
            name.find("sparse-") != std::string::npos && protocol == Protocol::Stream;
        const int64_t per_choice = protocol == Protocol::Stream ? 14 : name == "block+h2o" ? 3 : 1;
        if (is_full && !kivi) CHECK(saved == 0);
        else CHECK(saved == per_choice * (equal_lengths_only ? 1 : 2));
        // Without reuse, the same stream runs every call itself.
        int64_t none = 0;
        check_same(score_shared_context(model, *policy, Mode::Decode, requests, false, &none), one_by_one, true);
        CHECK(none == 0);
        ++policies_run;
      }
    }
  }
  CHECK(policies_run >= 4 * 14);
}

TEST_CASE("float64: continuing a shared context is bit for bit", "[reuse]") {
  ModelOptions options;
  options.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  for (const std::string name : {"h2o", "tova"}) {
    INFO("policy " << name);
    auto policy = make_policy(name, token_budget(9));
    const auto requests = document(*model, Protocol::Stream);
    int64_t saved = 0;
    const auto shared = score_shared_context(*model, *policy, Mode::Decode, requests, true, &saved);
    const auto one_by_one = alone(*model, *policy, Mode::Decode, requests);
    CHECK(saved == 2 * 14);
    for (size_t i = 0; i < requests.size(); ++i) {
      CHECK(test::max_diff(shared[i].next_token_logprob, one_by_one[i].next_token_logprob) <= 1e-9);
      CHECK(shared[i].next_token_logprob == one_by_one[i].next_token_logprob);
    }
  }
}

TEST_CASE("what must not be reused is not: budgets from each request's length, clone-less states, sim mode",
          "[reuse]") {
  const Model& model = test::stories();
  const auto requests = document(model, Protocol::Stream);
  auto run = [&](const Policy& policy, Mode mode, const std::vector<ScoreRequest>& rs) {
    int64_t saved = 0;
    check_same(score_shared_context(model, policy, mode, rs, true, &saved), alone(model, policy, mode, rs), true);
    return saved;
  };
  SECTION("a ratio budget under stream resolves against each joint length: only equal lengths share") {
    auto h2o = make_policy("h2o", ratio_budget(0.5));
    CHECK_FALSE(h2o->states_agree(shape_for(model, 19, 0), shape_for(model, 23, 0)));
    CHECK(h2o->states_agree(shape_for(model, 19, 0), shape_for(model, 19, 0)));
    CHECK(run(*h2o, Mode::Decode, requests) == 14);  // choices 0 and 2 (19 tokens each), not 1
    CHECK(run(*h2o, Mode::Decode, {requests[0], requests[1]}) == 0);
  }
  SECTION("a token budget does not read the length; --kv-memory does") {
    auto h2o = make_policy("h2o", token_budget(9));
    CHECK(h2o->states_agree(shape_for(model, 19, 0), shape_for(model, 23, 0)));
    CHECK_FALSE(h2o->states_agree(shape_for(model, 19, 0), shape_for(model, 19, 4)));  // another prefill
    PolicyOptions memory;
    memory.kv_quant.bits = 2;
    memory.kv_quant.group = 4;
    memory.kv_quant.residual = 8;
    memory.kv_quant.memory = 0.5;
    auto by_bytes = make_policy("local", memory);
    CHECK_FALSE(by_bytes->states_agree(shape_for(model, 19, 0), shape_for(model, 23, 0)));
    CHECK(run(*by_bytes, Mode::Decode, {requests[0], requests[1]}) == 0);
  }
  SECTION("a static pattern chooses its period for the length") {
    auto strided = make_policy("sparse-strided", token_budget(9));
    CHECK_FALSE(strided->states_agree(shape_for(model, 19, 0), shape_for(model, 23, 0)));
    CHECK(run(*strided, Mode::Decode, {requests[0], requests[1]}) == 0);
  }
  SECTION("a state that cannot be cloned runs every call itself") {
    NoClonePolicy no_clone;
    CHECK(run(no_clone, Mode::Decode, requests) == 0);
  }
  SECTION("sim mode is one pass per request: nothing to share") {
    for (const std::string name : {"full", "h2o", "h2o-paper", "h2o-global"}) {
      auto policy = make_policy(name, name == "full" ? PolicyOptions{} : ratio_budget(0.5));
      CHECK(run(*policy, Mode::Sim, requests) == 0);
    }
  }
  SECTION("two documents in one list: each shares its own context") {
    auto h2o = make_policy("h2o", token_budget(9));
    std::vector<ScoreRequest> mixed = document(model, Protocol::Stream);
    for (ScoreRequest r : document(model, Protocol::Stream, 11)) {
      r.tokens[0] = r.tokens[0] % 500 + 1;  // another document: no call in common with the first
      mixed.push_back(r);
    }
    CHECK(run(*h2o, Mode::Decode, mixed) == 2 * 14 + 2 * 11);
  }
  SECTION("requests with no token in common share nothing") {
    auto h2o = make_policy("h2o", token_budget(9));
    std::vector<ScoreRequest> apart = {requests[0], requests[1]};
    apart[1].tokens[0] = apart[0].tokens[0] % 500 + 1;
    CHECK(run(*h2o, Mode::Decode, apart) == 0);
  }
}

TEST_CASE("a fork goes on as the original would, and leaves the original as it was", "[reuse]") {
  // CacheAttention::fork directly: a context run once, then the same continuation through
  // the original and through its fork, against a fresh cache that runs both itself. DMC's
  // merge state (alone, and under h2o over its slots) and KIVI's stores are forked too.
  struct Case {
    std::string model, policy;
    PolicyOptions options;
  };
  PolicyOptions kivi;
  kivi.kv_quant.bits = 2;
  kivi.kv_quant.group = 4;
  kivi.kv_quant.residual = 8;
  kivi.budget.tokens = 9;
  const std::vector<Case> cases = {{"models/tiny-random-llama-dmc", "full", {}},
                                   {"models/tiny-random-llama-dmc", "h2o", token_budget(9)},
                                   {"models/stories260K-hf", "full", {}},
                                   {"models/stories260K-hf", "h2o", token_budget(9)},
                                   {"models/stories260K-hf", "ada+snapkv", token_budget(9)},
                                   {"models/stories260K-hf", "local", kivi}};
  for (const Case& c : cases) {
    INFO(c.model << " " << c.policy);
    auto model = Model::load(test::data(c.model), ModelOptions{});
    auto policy = make_policy(c.policy, c.options);
    const int vocab = static_cast<int>(model->arch().vocab);
    const std::vector<int> context = tokens_of(16, 5, vocab), rest = tokens_of(6, 6, vocab);
    const SequenceShape shape = shape_for(*model, 22, 0);
    // The context: one block under the full cache (with no KIVI), else one token at a time.
    const bool block = policy->keeps_everything() && !policy->options().kv_quant.enabled();
    auto run = [&](CacheAttention& cache, const std::vector<int>& tokens, int start) {
      std::vector<torch::Tensor> rows;
      if (block) {
        rows.push_back(model->forward(tokens, start, cache));
      } else {
        for (size_t i = 0; i < tokens.size(); ++i)
          rows.push_back(model->forward({tokens[i]}, start + static_cast<int>(i), cache));
      }
      return torch::cat(rows, 0);
    };
    CacheAttention original(*model, *policy, shape), fresh(*model, *policy, shape);
    run(original, context, 0);
    run(fresh, context, 0);
    auto fork = original.fork(shape);
    REQUIRE(fork);
    const auto from_fork = run(*fork, rest, 16);
    const auto from_original = run(original, rest, 16);
    const auto from_fresh = run(fresh, rest, 16);
    CHECK(torch::equal(from_fork, from_fresh));
    CHECK(torch::equal(from_original, from_fresh));
    CHECK(fork->stats().kept_per_head == fresh.stats().kept_per_head);
    CHECK(fork->stats().peak_bytes == fresh.stats().peak_bytes);
    CHECK(fork->stats().dmc_merge_rate == fresh.stats().dmc_merge_rate);
    CHECK(original.stats().kept_per_head == fresh.stats().kept_per_head);
  }
}

TEST_CASE("reuse composes with run_batched: documents at batch 1, 2 and 5 equal each request alone",
          "[reuse][batch]") {
  const Model& model = test::stories();
  std::vector<std::vector<ScoreRequest>> documents;
  for (int d = 0; d < 4; ++d) {
    auto doc = document(model, d % 2 ? Protocol::PrefillCompress : Protocol::Stream, 10 + 3 * d);
    if (d == 3) doc.resize(1);  // a document with one choice
    documents.push_back(doc);
  }
  for (const std::string name : {"full", "h2o", "tova", "snapkv"}) {
    INFO("policy " << name);
    auto policy = make_policy(name, name == "full" ? PolicyOptions{} : token_budget(8));
    for (int batch : {1, 2, 5}) {
      INFO("batch " << batch);
      int64_t saved = 0;
      std::vector<int> finished;
      const auto together = score_documents(model, *policy, Mode::Decode, documents, batch, true,
                                            [&](int d) { finished.push_back(d); }, &saved);
      CHECK(finished.size() == documents.size());
      if (name == "full") CHECK(saved == 0);  // one block per request: nothing shared
      else CHECK(saved > 0);
      for (size_t d = 0; d < documents.size(); ++d)
        check_same(together[d], alone(model, *policy, Mode::Decode, documents[d]), true);
    }
  }
}

TEST_CASE("eval: --no-context-reuse changes no prediction, score or agreement", "[reuse][eval]") {
  const Model& model = test::stories();
  auto run_at = [&](const std::string& task, const std::string& policy, Protocol protocol, bool reuse, int batch) {
    EvalConfig config;
    config.task = task;
    config.task_options.data_dir = test::data("");
    config.task_options.limit = 12;
    config.policy = policy;
    if (policy != "full") config.policy_options.budget.tokens = 8;
    config.mode = Mode::Decode;
    config.protocol = protocol;
    config.batch_size = batch;
    config.context_reuse = reuse;
    return evaluate(model, config);
  };
  for (const auto& [task, policy, protocol] : std::vector<std::tuple<std::string, std::string, Protocol>>{
           {"piqa", "h2o", Protocol::Stream}, {"copa", "full", Protocol::Stream},
           {"piqa", "snapkv", Protocol::PrefillCompress}, {"winogrande", "tova", Protocol::Stream}}) {
    for (int batch : {1, 3}) {
      INFO(task << " " << policy << " batch " << batch);
      const EvalResult off = run_at(task, policy, protocol, false, batch);
      const EvalResult on = run_at(task, policy, protocol, true, batch);
      REQUIRE(on.docs.size() == off.docs.size());
      for (size_t d = 0; d < off.docs.size(); ++d) {
        CHECK(on.docs[d].prediction.predicted == off.docs[d].prediction.predicted);
        CHECK(test::max_diff(on.docs[d].choice_scores, off.docs[d].choice_scores) <= 1e-5);
        CHECK(on.docs[d].choice_scores == off.docs[d].choice_scores);
      }
      REQUIRE(on.metrics.size() == off.metrics.size());
      for (size_t m = 0; m < off.metrics.size(); ++m) CHECK(on.metrics[m].value == off.metrics[m].value);
      CHECK(on.agreement_with_full == off.agreement_with_full);
      CHECK(on.kv_tokens_kept == off.kv_tokens_kept);
      CHECK(on.kv_bytes_peak == off.kv_bytes_peak);
    }
  }
  auto flag = test::run_kvevict("eval --model " + test::data("models/stories260K-hf") +
                                " --task copa --limit 3 --mode decode --policy h2o --budget-tokens 8 --no-context-reuse");
  CHECK(flag.exit_code == 0);
}

TEST_CASE("sweep: context_reuse false gives the same rows, and is not part of a cell", "[reuse][sweep]") {
  namespace fs = std::filesystem;
  const auto dir = test::temp_dir("reuse_sweep");
  auto write = [&](const std::string& name, const std::string& reuse) {
    const std::string path = (fs::path(dir) / name).string();
    std::ofstream(path) << R"({"name": "reuse", "tasks": ["copa"], "policies": ["h2o"], "budget_tokens": [8],
      "mode": "decode", "limit": 4, "max_length": 128, "context_reuse": )"
                        << reuse << "}";
    return path;
  };
  const std::string on = (fs::path(dir) / "on").string(), off = (fs::path(dir) / "off").string();
  REQUIRE(test::run_kvevict("sweep " + write("on.json", "true") + " --out " + on).exit_code == 0);
  REQUIRE(test::run_kvevict("sweep " + write("off.json", "false") + " --out " + off).exit_code == 0);
  const auto rows = test::rows_without_timing(on);
  CHECK(rows.size() == 1);
  CHECK(rows == test::rows_without_timing(off));
  // The folder made with reuse resumes without it: the same sweep, every cell finished.
  CHECK(test::run_kvevict("sweep " + write("off.json", "false") + " --out " + on).exit_code == 0);
  CHECK(test::rows_without_timing(on) == rows);
  auto bad = test::run_kvevict("sweep " + write("bad.json", "\"no\"") + " --out " + (fs::path(dir) / "bad").string());
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("context_reuse"));
}
