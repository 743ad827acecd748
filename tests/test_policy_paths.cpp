// The paths a policy takes through the harness, on the real stories260K model: the full
// cache against a forward with no policy at all, eviction during generate() against sim
// mode, the XSum eval path, and prefill-compress through eval.
#include "harness/common/errors.h"
#include "harness/eval/evaluator.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tasks/rouge.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

using test::max_diff;

const Model& stories64() {
  static auto model = [] {
    ModelOptions options;
    options.dtype = "float64";  // the modes then agree to rounding, so argmax ties cannot flip
    return Model::load(test::data("models/stories260K-hf"), options);
  }();
  return *model;
}

PolicyOptions budget(double ratio) {
  PolicyOptions o;
  o.budget.ratio = ratio;
  o.params.set("window", 8);
  return o;
}

}  // namespace

TEST_CASE("the full cache leaves log-probs exactly as a forward without any policy", "[policy][full]") {
  const auto tokens = test::golden_tokens();
  for (const Model* model : {&test::stories(), &stories64()}) {
    FullAttention attention;
    auto logprobs = torch::log_softmax(model->forward(tokens, 0, attention).to(torch::kFloat64), -1);
    auto acc = logprobs.accessor<double, 2>();
    std::vector<double> reference;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) reference.push_back(acc[i][tokens[i + 1]]);
    auto full = make_policy(reference_policy_name(), {});
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      for (int prefill : {0, 100}) {
        auto score = score_sequence(*model, *full, mode, tokens, prefill);
        INFO("mode " << mode_name(mode) << " prefill " << prefill << " dtype " << model->dtype());
        CHECK(max_diff(score.next_token_logprob, reference) == 0);
        for (int kept : score.kv.kept_per_layer) CHECK(kept == static_cast<int>(tokens.size()));
      }
    }
  }
}

TEST_CASE("generate evicts in decode mode exactly as sim mode scores the same tokens", "[policy][generate]") {
  const Model& model = stories64();
  const std::vector<int> prompt = model.encode("Once upon a time, there was a little girl named Lily. She", true);
  const int P = static_cast<int>(prompt.size());
  int evicting_runs = 0;
  for (const std::string& name : policy_names()) {
    auto policy = make_policy(name, test::runnable_on(name, model, budget(0.4)));
    if (!policy->realisable()) continue;
    for (bool stream : {true, false}) {
      if (stream && test::needs_prepass(name)) continue;  // it needs a prefill
      GenerateOptions options;
      options.max_new_tokens = 20;
      options.stream = stream;
      const Generation generation = generate(model, *policy, prompt, options);
      REQUIRE(!generation.tokens.empty());
      // Sim mode over prompt + generation: the prompt is the budget's length and, when
      // not streamed, the prefill; each generated token must be the argmax of its row.
      std::vector<int> sequence = prompt;
      sequence.insert(sequence.end(), generation.tokens.begin(), generation.tokens.end() - 1);
      const SequenceScore sim = score_sequence(model, *policy, Mode::Sim, sequence, stream ? 0 : P, P);
      INFO(name << (stream ? " stream" : " prefill"));
      for (size_t t = 0; t < generation.tokens.size(); ++t) CHECK(sim.argmax[P - 1 + t] == generation.tokens[t]);
      CHECK(sim.kv.kept_per_layer == generation.kv.kept_per_layer);
      const int length = static_cast<int>(sequence.size());
      if (!policy->keeps_everything() && generation.kv.kept_per_layer[0] < length) ++evicting_runs;
    }
  }
  CHECK(evicting_runs >= 10);  // the check above ran with eviction, not only the full cache
}

TEST_CASE("the XSum eval path generates, scores ROUGE and averages over documents", "[policy][xsum][eval]") {
  EvalConfig config;
  config.task = "xsum";
  config.task_options.data_dir = test::data("");
  config.task_options.limit = 2;
  config.policy = "h2o";
  config.policy_options = budget(0.5);
  config.mode = Mode::Decode;
  config.max_length = 256;
  config.compare_with_full = false;
  const EvalResult result = evaluate(test::stories(), config);
  REQUIRE(result.n == 2);
  REQUIRE(result.docs.size() == 2);
  // Each document's text is the policy's own generation from the truncated prompt.
  auto task = make_task("xsum");
  const auto docs = task->generation_docs(config.task_options);
  auto policy = make_policy(config.policy, config.policy_options);
  double rouge1 = 0;
  for (size_t d = 0; d < 2; ++d) {
    std::vector<int> prompt = test::stories().encode(docs[d].prompt, true);
    const int room = config.max_length - docs[d].max_new_tokens;
    if (static_cast<int>(prompt.size()) > room) prompt.erase(prompt.begin(), prompt.end() - room);
    GenerateOptions options;
    options.max_new_tokens = docs[d].max_new_tokens;
    options.stop = docs[d].stop;
    options.stream = true;
    const Generation generation = generate(test::stories(), *policy, prompt, options);
    INFO("document " << d);
    CHECK(result.docs[d].generated == generation.text);
    CHECK(result.docs[d].reference == docs[d].reference);
    rouge1 += 100 * rouge_scores(docs[d].reference, generation.text).rouge1 / 2;
    CHECK(generation.kv.kept_per_layer[0] < static_cast<int>(prompt.size()));  // h2o evicted
  }
  const auto metric = std::find_if(result.metrics.begin(), result.metrics.end(),
                                   [](const MetricValue& m) { return m.name == "rouge1"; });
  REQUIRE(metric != result.metrics.end());
  CHECK(std::abs(metric->value - rouge1) < 1e-9);
  CHECK(result.kv_tokens_kept < 256);
}

TEST_CASE("prefill-compress through eval: the context runs in full, its budget, then eviction", "[policy][eval][prefill]") {
  EvalConfig config;
  config.task = "piqa";
  config.task_options.data_dir = test::data("");
  config.task_options.limit = 4;
  config.policy = "snapkv";
  config.policy_options = budget(0.2);
  config.compare_with_full = false;
  config.protocol = Protocol::PrefillCompress;
  config.mode = Mode::Decode;
  const EvalResult decode = evaluate(test::stories(), config);
  config.mode = Mode::Sim;
  const EvalResult sim = evaluate(test::stories(), config);
  config.protocol = Protocol::Stream;
  const EvalResult stream = evaluate(test::stories(), config);
  config.policy = reference_policy_name();
  const EvalResult full = evaluate(test::stories(), config);
  REQUIRE(decode.docs.size() == 4);
  bool differs_from_stream = false, differs_from_full = false;
  for (size_t d = 0; d < decode.docs.size(); ++d) {
    INFO("document " << d);
    CHECK(max_diff(decode.docs[d].choice_scores, sim.docs[d].choice_scores) < 5e-5);
    differs_from_stream |= max_diff(decode.docs[d].choice_scores, stream.docs[d].choice_scores) > 1e-3;
    differs_from_full |= max_diff(decode.docs[d].choice_scores, full.docs[d].choice_scores) > 1e-3;
  }
  CHECK(differs_from_stream);
  CHECK(differs_from_full);
  // The budget is a share of the context, so the compressed cache is far smaller than the stream's.
  CHECK(decode.kv_tokens_kept < stream.kv_tokens_kept);

  // Perplexity: the first half is the prefill (full attention), the NLL covers the rest.
  EvalConfig ppl;
  ppl.task = "perplexity";
  ppl.task_options.data_dir = test::data("");
  ppl.policy = "h2o";
  ppl.policy_options = budget(0.2);
  ppl.protocol = Protocol::PrefillCompress;
  ppl.max_length = 120;
  ppl.compare_with_full = false;
  const EvalResult compressed = evaluate(test::stories(), ppl);
  std::vector<int> tokens = test::stories().encode(test::read_text(test::data("text/tinystories_sample.txt")), true);
  tokens.resize(120);
  const SequenceScore score = score_sequence(test::stories(), *make_policy("h2o", ppl.policy_options), Mode::Sim,
                                             tokens, 60, 60);
  double nll = 0;
  for (size_t i = 59; i < score.next_token_logprob.size(); ++i) nll -= score.next_token_logprob[i];
  REQUIRE(compressed.metrics.at(0).name == "mean_nll");
  CHECK(compressed.metrics.at(0).n == 60);
  CHECK(std::abs(compressed.metrics.at(0).value - nll / 60) < 1e-9);
}
