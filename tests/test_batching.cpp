// Batched evaluation (issue 31): the B-row decode kernel, Model::forward_batch over a
// ragged batch of sequences with their own backends, batched scoring and continuous
// batching for generation. Every number must equal the same request alone: the tests
// compare bit for bit where the design promises it, and through tests/compare.h's
// max_diff against the issue's tolerances (1e-5 float32, 1e-9 float64) everywhere.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/eval/evaluator.h"
#include "harness/model/matvec.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/scorer.h"
#include "harness/runtime/stream_batcher.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::same_bits;

using kvevict::test::tokens_of;

namespace {

// A 2-layer random LLaMA with hidden 512: its matrices are 1 MiB in float32, so decode
// rows take matvec() (alone) and its B-row form (batched); the data's test models are
// smaller and keep torch::mv.
// Shared by the cases, so the process owns its folder, not a case.
const std::string& matvec_model_dir() {
  static const test::TempDir dir("batch_random_512");
  static const bool made = [] {
    auto r = test::run_kvevict("make-random-model --out " + dir.path() +
                               " --layers 2 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1024 --vocab 600"
                               " --max-positions 128");
    if (r.exit_code != 0) throw std::runtime_error("make-random-model failed: " + r.err);
    return true;
  }();
  (void)made;
  return dir.path();
}

std::unique_ptr<Policy> policy_at(const std::string& name, double ratio) {
  PolicyOptions options;
  if (name != reference_policy_name()) options.budget.ratio = ratio;
  return make_policy(name, options);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  auto x = a.to(torch::kFloat64).contiguous(), y = b.to(torch::kFloat64).contiguous();
  std::vector<double> u(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
  std::vector<double> v(y.data_ptr<double>(), y.data_ptr<double>() + y.numel());
  return test::max_diff(u, v);
}

// Teacher-forced decode of several sequences with their own backends, every step in one
// forward_batch: sequence i runs its first prefill[i] tokens as one block, then one token
// per step; a shorter one leaves the batch when it ends. Returns each one's logits [T_i, vocab].
std::vector<torch::Tensor> decode_together(const Model& model, const std::vector<std::vector<int>>& seqs,
                                           const std::vector<int>& prefill,
                                           std::vector<std::unique_ptr<AttentionBackend>>& backends) {
  std::vector<std::vector<torch::Tensor>> rows(seqs.size());
  std::vector<size_t> done(seqs.size(), 0);
  while (true) {
    std::vector<BatchSegment> segments;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (done[i] >= seqs[i].size()) continue;
      const size_t take = done[i] == 0 && prefill[i] > 1 ? static_cast<size_t>(prefill[i]) : 1;
      segments.push_back({std::vector<int>(seqs[i].begin() + done[i], seqs[i].begin() + done[i] + take),
                          static_cast<int64_t>(done[i]), backends[i].get()});
      which.push_back(i);
      done[i] += take;
    }
    if (segments.empty()) break;
    auto logits = model.forward_batch(segments);
    REQUIRE(logits.size() == segments.size());
    for (size_t k = 0; k < which.size(); ++k) rows[which[k]].push_back(logits[k]);
  }
  std::vector<torch::Tensor> out;
  for (auto& r : rows) out.push_back(torch::cat(r, 0));
  return out;
}

torch::Tensor decode_alone(const Model& model, const std::vector<int>& seq, int prefill, AttentionBackend& backend) {
  std::vector<torch::Tensor> rows;
  size_t done = 0;
  if (prefill > 1) {
    rows.push_back(model.forward(std::vector<int>(seq.begin(), seq.begin() + prefill), 0, backend));
    done = prefill;
  }
  for (; done < seq.size(); ++done) rows.push_back(model.forward({seq[done]}, static_cast<int64_t>(done), backend));
  return torch::cat(rows, 0);
}

}  // namespace

TEST_CASE("matvec of B rows gives each row's bits alone", "[batch][matvec]") {
  torch::manual_seed(5);
  // Odd sizes: 300 inputs leave tails of the 32- and 8-wide loops; B 1..7 runs the 3-, 2-
  // and 1-row kernels.
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto weight = torch::randn({517, 300}).to(dtype);
    auto bias = torch::randn({517}).to(dtype);
    for (int64_t B = 1; B <= 7; ++B) {
      auto x = torch::randn({B, 300}).to(dtype);
      auto together = matvec(weight, x, bias);
      REQUIRE(together.sizes() == torch::IntArrayRef({B, 517}));
      for (int64_t b = 0; b < B; ++b) {
        auto alone = matvec(weight, x.narrow(0, b, 1), bias);
        CHECK(same_bits(together.narrow(0, b, 1), alone));
      }
      auto exact = torch::addmm(bias.to(torch::kFloat64), x.to(torch::kFloat64), weight.to(torch::kFloat64).t());
      const double scale = exact.abs().max().item<double>();
      CHECK(max_abs_diff(together, exact) <= (dtype == torch::kFloat32 ? 1e-5 : 1.0 / 128) * scale);
    }
  }
}

TEST_CASE("forward_batch: mixed lengths, prefill blocks beside decode rows, each equals its sequence alone",
          "[batch]") {
  // stories260K (torch::mv path) and the 512-wide random model (matvec path), float32 and
  // the float64 check dtype.
  struct Case {
    std::string dir, dtype;
    double tolerance;
  };
  const std::vector<Case> cases = {{test::data("models/stories260K-hf"), "float32", 1e-5},
                                   {test::data("models/stories260K-hf"), "float64", 1e-9},
                                   {matvec_model_dir(), "float32", 1e-5},
                                   {matvec_model_dir(), "bfloat16", 0}};
  for (const Case& c : cases) {
    ModelOptions options = test::model_options();
    options.dtype = c.dtype;
    auto model = Model::load(c.dir, options);
    const int vocab = static_cast<int>(model->arch().vocab);
    // Four sequences: different lengths, prefill blocks of different sizes (1: stream).
    const std::vector<std::vector<int>> seqs = {tokens_of(23, 1, vocab), tokens_of(9, 2, vocab),
                                                tokens_of(31, 3, vocab), tokens_of(4, 4, vocab)};
    const std::vector<int> prefill = {7, 1, 12, 3};
    // Different policies and budgets per sequence (a ratio resolves against each one's length).
    const std::vector<std::pair<std::string, double>> policies = {
        {"h2o", 0.3}, {"full", 0}, {"tova", 0.5}, {"streamingllm", 0.6}};
    std::vector<std::unique_ptr<Policy>> made;
    std::vector<std::unique_ptr<AttentionBackend>> together, alone;
    for (size_t i = 0; i < seqs.size(); ++i) {
      made.push_back(policy_at(policies[i].first, policies[i].second));
      const SequenceShape shape = shape_for(*model, static_cast<int>(seqs[i].size()), prefill[i]);
      together.push_back(std::make_unique<CacheAttention>(*model, *made.back(), shape));
      alone.push_back(std::make_unique<CacheAttention>(*model, *made.back(), shape));
    }
    auto batched = decode_together(*model, seqs, prefill, together);
    for (size_t i = 0; i < seqs.size(); ++i) {
      INFO(c.dir << " " << c.dtype << " sequence " << i << " under " << policies[i].first);
      auto single = decode_alone(*model, seqs[i], prefill[i], *alone[i]);
      CHECK(max_abs_diff(batched[i], single) <= c.tolerance);
      CHECK(same_bits(batched[i], single));  // the design's promise: the same ops on the same rows
      const KvStats& a = static_cast<CacheAttention&>(*together[i]).stats();
      const KvStats& b = static_cast<CacheAttention&>(*alone[i]).stats();
      CHECK(a.kept_per_head == b.kept_per_head);
      CHECK(a.peak_bytes == b.peak_bytes);
    }
  }
}

TEST_CASE("every realisable policy in decode mode: batched scores equal batch 1", "[batch]") {
  const Model& model = test::stories();
  const int vocab = static_cast<int>(model.arch().vocab);
  // Mixed lengths; under prefill-compress the budgets resolve against each one's prefill.
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 5; ++i) {
    ScoreRequest r;
    r.tokens = tokens_of(18 + 7 * i, 10 + i, vocab);
    r.prefill_len = i % 2 == 0 ? 0 : 6 + i;
    r.budget_length = r.prefill_len > 0 ? r.prefill_len : static_cast<int>(r.tokens.size());
    requests.push_back(r);
  }
  int policies_run = 0;
  for (const std::string& name : policy_names()) {
    PolicyOptions options;
    if (name != reference_policy_name()) options.budget.ratio = 0.5;
    auto policy = make_policy(name, test::runnable_on(name, model, options));
    if (!policy->realisable() || test::needs_prepass(name)) continue;  // half the requests stream
    INFO("policy " << name);
    std::vector<SequenceScore> alone;
    for (const auto& r : requests)
      alone.push_back(score_sequence(model, *policy, Mode::Decode, r.tokens, r.prefill_len, r.budget_length));
    for (int batch : {3, 8}) {  // 8: larger than the number of requests
      auto together = score_batch(model, *policy, Mode::Decode, requests, batch);
      REQUIRE(together.size() == requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        CHECK(test::max_diff(together[i].next_token_logprob, alone[i].next_token_logprob) <= 1e-5);
        CHECK(together[i].next_token_logprob == alone[i].next_token_logprob);
        CHECK(together[i].argmax == alone[i].argmax);
        CHECK(together[i].kv.kept_per_head == alone[i].kv.kept_per_head);
      }
    }
    ++policies_run;
  }
  CHECK(policies_run >= 10);
}

TEST_CASE("sim mode: batched scores equal batch 1, sim-only policies included", "[batch]") {
  const Model& model = test::stories();
  const int vocab = static_cast<int>(model.arch().vocab);
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back({tokens_of(12 + 9 * i, 20 + i, vocab)});
  for (const std::string name : {"full", "h2o", "h2o-paper", "h2o-global"}) {
    INFO("policy " << name);
    auto policy = policy_at(name, 0.4);
    auto together = score_batch(model, *policy, Mode::Sim, requests, 3);
    for (size_t i = 0; i < requests.size(); ++i) {
      auto alone = score_sequence(model, *policy, Mode::Sim, requests[i].tokens);
      CHECK(test::max_diff(together[i].next_token_logprob, alone.next_token_logprob) <= 1e-5);
      CHECK(together[i].argmax == alone.argmax);
    }
  }
}

TEST_CASE("continuous batching: a sequence that stops first leaves, the next joins, generations are identical",
          "[batch]") {
  // One request thread, so one continuous batch and an order to check (stories260K runs a
  // batch on each of its request threads otherwise: the next test).
  ModelOptions one_worker = test::model_options();
  one_worker.threads = 1;
  const auto loaded = Model::load(test::data("models/stories260K-hf"), one_worker);
  const Model& model = *loaded;
  REQUIRE(model.request_workers() == 1);
  std::vector<std::vector<int>> prompts;
  std::vector<GenerateOptions> options;
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day", "A big red ball", "The sun was"};
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts.push_back(model.encode(texts[i], true));
    GenerateOptions o;
    o.max_new_tokens = i == 1 ? 3 : 20 + static_cast<int>(i) * 5;  // the second stops first
    if (i == 2) o.stop = {"."};                                   // a stop string
    if (i == 4) o.temperature = 0.8, o.seed = 99;                 // sampled, from its own seed
    o.top_logprobs = 2;
    options.push_back(o);
  }
  for (const std::string name : {"full", "h2o", "streamingllm"}) {
    INFO("policy " << name);
    auto policy = policy_at(name, 0.5);
    std::vector<Generation> alone;
    for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(generate(model, *policy, prompts[i], options[i]));
    CHECK(alone[1].tokens.size() <= 3);
    CHECK(alone[1].tokens.size() < alone[0].tokens.size());  // one sequence stops before the others
    for (int batch : {1, 3, 8}) {
      INFO("batch " << batch);
      std::vector<int> order;
      auto together = generate_batch(model, *policy, prompts, options, batch, [&](int i) { order.push_back(i); });
      REQUIRE(together.size() == prompts.size());
      CHECK(order.size() == prompts.size());
      // The first to finish is one of the first batch that joined with the fewest steps
      // (every prompt here is one block; each step after it chooses one token).
      size_t fewest = alone[0].chosen.size();
      for (size_t i = 1; i < std::min<size_t>(batch, prompts.size()); ++i) fewest = std::min(fewest, alone[i].chosen.size());
      CHECK(alone[order.front()].chosen.size() == fewest);
      CHECK(order.front() < batch);
      for (size_t i = 0; i < prompts.size(); ++i) {
        CHECK(together[i].tokens == alone[i].tokens);
        CHECK(together[i].text == alone[i].text);
        CHECK(together[i].finish == alone[i].finish);
        REQUIRE(together[i].chosen.size() == alone[i].chosen.size());
        for (size_t k = 0; k < alone[i].chosen.size(); ++k)
          CHECK(together[i].chosen[k].logprob == alone[i].chosen[k].logprob);
        CHECK(together[i].kv.kept_per_head == alone[i].kv.kept_per_head);
      }
    }
  }
}

TEST_CASE("a one-thread-op model runs a batch on each request thread, every number as alone", "[batch]") {
  ModelOptions two_workers = test::model_options();
  two_workers.threads = 2;
  const auto loaded = Model::load(test::data("models/stories260K-hf"), two_workers);
  const Model& model = *loaded;
  REQUIRE(model.request_workers() == 2);
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day", "A big red ball", "The sun was", "Tom had a cat"};
  std::vector<std::vector<int>> prompts;
  std::vector<GenerateOptions> options;
  std::vector<ScoreRequest> requests;
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts.push_back(model.encode(texts[i], true));
    GenerateOptions o;
    o.max_new_tokens = 4 + 3 * static_cast<int>(i);
    if (i == 2) o.temperature = 0.8, o.seed = 7;
    options.push_back(o);
    requests.push_back({model.encode(texts[i] + " and they were happy.", true), 0, 0, -1, 0, 0});
  }
  for (const std::string name : {"full", "h2o"}) {
    auto policy = policy_at(name, 0.5);
    for (int batch : {1, 2, 3}) {  // two, and then one, continuous batches on the two threads
      INFO("policy " << name << " batch " << batch);
      std::vector<int> generated_order, scored_order;
      auto together = generate_batch(model, *policy, prompts, options, batch, [&](int i) { generated_order.push_back(i); });
      auto scores = score_batch(model, *policy, Mode::Decode, requests, batch, [&](int i) { scored_order.push_back(i); });
      std::sort(generated_order.begin(), generated_order.end());
      std::sort(scored_order.begin(), scored_order.end());
      std::vector<int> every(texts.size());
      for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
      CHECK(generated_order == every);  // finished once for each, one call at a time
      CHECK(scored_order == every);
      for (size_t i = 0; i < texts.size(); ++i) {
        const Generation alone = generate(model, *policy, prompts[i], options[i]);
        CHECK(together[i].tokens == alone.tokens);
        REQUIRE(together[i].chosen.size() == alone.chosen.size());
        for (size_t k = 0; k < alone.chosen.size(); ++k) CHECK(together[i].chosen[k].logprob == alone.chosen[k].logprob);
        const SequenceScore single = score_sequence(model, *policy, Mode::Decode, requests[i].tokens);
        CHECK(scores[i].next_token_logprob == single.next_token_logprob);
        CHECK(scores[i].kv.kept_per_head == single.kv.kept_per_head);
      }
    }
  }
}

TEST_CASE("StreamBatcher: streams from several threads, and one joining while others run, equal each alone",
          "[batch]") {
  const Model& model = test::stories();
  auto policy = policy_at("h2o", 0.5);
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                          "One day", "A big red ball"};
  std::vector<std::vector<int>> prompts;
  std::vector<GenerateOptions> options;
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts.push_back(model.encode(texts[i], true));
    GenerateOptions o;
    o.max_new_tokens = 12 + 6 * static_cast<int>(i);
    if (i == 3) o.temperature = 0.8, o.seed = 5;
    o.top_logprobs = 2;
    options.push_back(o);
  }
  const std::vector<int> scored = model.encode("Tom had a red ball. He liked to play with it every day.", false);
  std::vector<Generation> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(generate(model, *policy, prompts[i], options[i]));
  const SequenceScore scored_alone = score_sequence(model, *policy, Mode::Decode, scored, 0, 0, -1, 0, 3);
  REQUIRE(alone[0].tokens.size() >= 3);

  StreamBatcher batcher(model, 3);
  // Generation 0's first token submits the score stream: it joins while 0 still runs.
  ScoreStream joining(model, *policy, Mode::Decode, {scored, 0, 0, -1, 0, 3});
  std::promise<void> joined;
  GenerateOptions first = options[0];
  bool submitted = false;
  first.on_token = [&](int) {
    if (!submitted) batcher.submit(joining, [&joined](std::exception_ptr) { joined.set_value(); });
    submitted = true;
    return true;
  };
  std::vector<Generation> together(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      GenerationStream stream(model, *policy, prompts[i], i == 0 ? first : options[i]);
      batcher.run(stream);
      together[i] = stream.result();
    });
  for (auto& t : threads) t.join();
  joined.get_future().get();
  const SequenceScore scored_together = joining.result();
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("generation " << i);
    CHECK(together[i].tokens == alone[i].tokens);
    CHECK(together[i].text == alone[i].text);
    REQUIRE(together[i].chosen.size() == alone[i].chosen.size());
    for (size_t k = 0; k < alone[i].chosen.size(); ++k) CHECK(together[i].chosen[k].logprob == alone[i].chosen[k].logprob);
    CHECK(together[i].kv.kept_per_head == alone[i].kv.kept_per_head);
  }
  CHECK(scored_together.next_token_logprob == scored_alone.next_token_logprob);
  CHECK(scored_together.argmax == scored_alone.argmax);
  const StreamBatcher::Stats stats = batcher.stats();
  CHECK(stats.largest >= 2);
  CHECK(stats.largest <= 3);
  CHECK(stats.segments > stats.model_calls);
  CHECK(stats.calls_of_size[1] + stats.calls_of_size[2] + stats.calls_of_size[3] == stats.model_calls);
  CHECK(stats.running == 0);
  CHECK(stats.waiting == 0);

  // A model call that throws reaches the stream in it; the batcher runs on.
  struct OutsideVocabulary : BatchStream {
    explicit OutsideVocabulary(const Model& m, const Policy& p)
        : cache(std::make_unique<CacheAttention>(m, p, shape_for(m, 4, 0))) {}
    bool done() const override { return false; }
    BatchSegment next() override { return {{-1}, 0, cache.get()}; }
    void take(const torch::Tensor&) override {}
    std::unique_ptr<CacheAttention> cache;
  } bad(model, *policy);
  CHECK_THROWS_WITH(batcher.run(bad), Catch::Contains("outside the vocabulary"));
  GenerationStream after(model, *policy, prompts[1], options[1]);
  batcher.run(after);
  CHECK(after.result().tokens == alone[1].tokens);
}

TEST_CASE("eval: accuracy, log-likelihoods and generations do not depend on --batch-size", "[batch][eval]") {
  const Model& model = test::stories();
  auto run_at = [&](const std::string& task, const std::string& policy, Mode mode, int batch) {
    EvalConfig config;
    config.task = task;
    config.task_options.data_dir = test::data("");
    config.task_options.limit = task == "xsum" ? 4 : 12;
    config.policy = policy;
    if (policy != "full") config.policy_options.budget.ratio = 0.5;
    config.mode = mode;
    config.batch_size = batch;
    return evaluate(model, config);
  };
  for (const auto& [task, policy, mode] : std::vector<std::tuple<std::string, std::string, Mode>>{
           {"piqa", "full", Mode::Decode}, {"piqa", "h2o", Mode::Decode}, {"copa", "tova", Mode::Sim},
           {"xsum", "h2o", Mode::Decode}, {"xsum", "full", Mode::Decode}}) {
    INFO(task << " " << policy);
    const EvalResult one = run_at(task, policy, mode, 1);
    for (int batch : {3, 8}) {
      const EvalResult many = run_at(task, policy, mode, batch);
      REQUIRE(many.docs.size() == one.docs.size());
      for (size_t d = 0; d < one.docs.size(); ++d) {
        CHECK(many.docs[d].prediction.predicted == one.docs[d].prediction.predicted);
        CHECK(test::max_diff(many.docs[d].choice_scores, one.docs[d].choice_scores) <= 1e-5);
        CHECK(many.docs[d].generated == one.docs[d].generated);
      }
      REQUIRE(many.metrics.size() == one.metrics.size());
      for (size_t m = 0; m < one.metrics.size(); ++m) CHECK(many.metrics[m].value == one.metrics[m].value);
      CHECK(many.agreement_with_full == one.agreement_with_full);
      CHECK(many.kv_tokens_kept == one.kv_tokens_kept);
    }
  }
}

TEST_CASE("sweep: batch_size is not part of a cell, and a folder resumes under another batch size", "[batch][sweep]") {
  namespace fs = std::filesystem;
  const auto dir = test::temp_dir("batch_sweep");
  auto write = [&](const std::string& name, int batch) {
    const std::string path = (fs::path(dir) / name).string();
    std::ofstream(path) << R"({"name": "batch", "tasks": ["copa", "xsum"], "policies": ["full", "h2o"], "budgets": [0.5],
      "mode": "decode", "limit": 3, "max_length": 128, "batch_size": )"
                        << batch << "}";
    return path;
  };
  auto rows_of = [&](const std::string& out) {
    std::vector<std::string> rows = test::rows_without_timing(out);
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  const std::string one = (fs::path(dir) / "one").string(), three = (fs::path(dir) / "three").string();
  REQUIRE(test::run_kvevict("sweep " + write("b1.json", 1) + " --out " + one).exit_code == 0);
  REQUIRE(test::run_kvevict("sweep " + write("b3.json", 3) + " --out " + three).exit_code == 0);
  const auto rows = rows_of(one);
  CHECK(rows.size() >= 4);
  CHECK(rows == rows_of(three));
  // The same folder under batch size 3: every cell is finished already, nothing is refused.
  auto again = test::run_kvevict("sweep " + write("b3.json", 3) + " --out " + one);
  CHECK(again.exit_code == 0);
  CHECK(rows_of(one) == rows);
  // A batch size below 1 is refused with the key's name.
  auto bad = test::run_kvevict("sweep " + write("b0.json", 0) + " --out " + (fs::path(dir) / "bad").string());
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("batch_size"));
}

TEST_CASE("the goldens hold at batch sizes 1, 3 and 8", "[batch][golden]") {
  // golden/README.md: a float32 implementation matches the float64 references' log-probs
  // within 1e-4. Each golden sequence is scored beside shorter neighbours (its own
  // prefixes and a reversed copy), so a batch of 3 and one of 8 both hold it with others.
  struct Golden {
    std::string model, file, policy;
    PolicyOptions options;
    std::string key;
  };
  std::vector<Golden> goldens;
  const auto stories_golden = test::read_json(test::data("golden/stories260K_tinystories_T200.json"));
  goldens.push_back({"models/stories260K-hf", "golden/stories260K_tinystories_T200.json", "full", {}, "full"});
  PolicyOptions paper;
  paper.budget.heavy_ratio = stories_golden["h2o_paper"]["heavy_ratio"].get<double>();
  paper.budget.recent_ratio = stories_golden["h2o_paper"]["recent_ratio"].get<double>();
  goldens.push_back({"models/stories260K-hf", "golden/stories260K_tinystories_T200.json", "h2o-paper", paper, "h2o_paper"});
  PolicyOptions local;
  local.budget.tokens = stories_golden["local"]["recent_budget"].get<int>();
  goldens.push_back({"models/stories260K-hf", "golden/stories260K_tinystories_T200.json", "local", local, "local"});
  for (const std::string name : {"tiny-random-opt", "tiny-random-gptneox", "tiny-random-llama3", "tiny-random-mistral",
                                 "tiny-random-qwen2", "tiny-random-qwen3", "tiny-random-phi3", "tiny-random-opt-postln"})
    goldens.push_back({"models/" + name, "golden/tiny_models/" + name + ".json", "full", {}, "full"});
  for (const Golden& g : goldens) {
    const auto golden = test::read_json(test::data(g.file));
    const auto tokens = golden["tokens"].get<std::vector<int>>();
    const auto expected = golden[g.key]["next_token_logprob"].get<std::vector<double>>();
    auto model = Model::load(test::data(g.model), test::model_options());
    auto policy = make_policy(g.policy, g.options);
    std::vector<ScoreRequest> requests = {{tokens}};
    for (int k = 1; k < 8; ++k) {
      // At least 48 tokens (local's budget of 40 must fit), at most the golden's length.
      const size_t length = std::clamp<size_t>(tokens.size() * k / 9 + 2, std::min<size_t>(tokens.size(), 48), tokens.size());
      std::vector<int> neighbour(tokens.begin(), tokens.begin() + length);
      if (k % 2 == 0) std::reverse(neighbour.begin(), neighbour.end());
      requests.push_back({neighbour});
    }
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      if (mode == Mode::Decode && !policy->realisable()) continue;
      for (int batch : {1, 3, 8}) {
        INFO(g.model << " " << g.policy << " " << mode_name(mode) << " batch " << batch);
        auto scores = score_batch(*model, *policy, mode, requests, batch);
        CHECK(test::max_diff(scores[0].next_token_logprob, expected) < 1e-4);
      }
    }
  }
}
