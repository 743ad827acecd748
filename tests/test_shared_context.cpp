// SCBench's shared-context evaluation (Li et al. 2024, arXiv 2412.10319): several
// questions of one context, asked one after another of one cache (multi-turn) or each of
// its own fork of the compressed context (multi-request). Multi-request's turn k must be
// the single-question run of question k, bit for bit (the same calls); multi-turn's first
// turn too; later turns must continue the same cache (positions, tokens held), under the
// budget at every turn; the per-turn scores must reach results.csv and read back.
#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/config/sweep_grid.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/result_rows.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tasks/long_context.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::tokens_of;

namespace {

PolicyOptions shared_context_budget(const std::string& policy, int tokens) {
  PolicyOptions options;
  if (!is_reference_policy(policy)) options.budget.tokens = tokens;
  return options;
}

// A 40-token context and three questions of 6, 6 and 8 tokens (two of one length, whose
// policy states agree, so multi-request can fork), 5 tokens of answer each.
TurnsRequest shared_context_request(int vocab) {
  TurnsRequest request;
  request.context = tokens_of(40, 7, vocab);
  request.questions = {tokens_of(6, 11, vocab), tokens_of(6, 12, vocab), tokens_of(8, 13, vocab)};
  for (size_t k = 0; k < request.questions.size(); ++k) {
    GenerateOptions options;
    options.max_new_tokens = 5;
    request.options.push_back(options);
  }
  return request;
}

// The single-question run of question k: context + question, the question fed after the
// context was prefilled and compressed.
Generation shared_context_alone(const Model& model, const Policy& policy, const TurnsRequest& request, size_t k) {
  std::vector<int> prompt = request.context;
  prompt.insert(prompt.end(), request.questions[k].begin(), request.questions[k].end());
  GenerateOptions options = request.options[k];
  options.question_tokens = static_cast<int>(request.questions[k].size());
  return generate(model, policy, prompt, options);
}

// The positions the cache has run once turn k's answer is chosen: every token but the
// answer's last (which the next turn feeds first), all of them after an EOS.
int shared_context_ran(const TurnsRequest& request, const std::vector<Generation>& turns, size_t k) {
  int ran = static_cast<int>(request.context.size());
  for (size_t j = 0; j <= k; ++j) {
    ran += static_cast<int>(request.questions[j].size() + turns[j].tokens.size());
    if (turns[j].finish != FinishReason::Eos && !turns[j].tokens.empty() && j == k) --ran;
  }
  return ran;
}

EvalConfig shared_context_config(const std::string& policy, SharedContext protocol, int turns) {
  EvalConfig c;
  c.task = "ruler_niah_multikey_2";  // a needle haystack: its distractors' keys are asked too
  c.task_options.data_dir = test::data("");
  c.task_options.length = 500;
  c.task_options.limit = 2;
  c.task_options.seed = 3;
  c.task_options.turns = turns;
  c.policy = policy;
  if (!is_reference_policy(policy)) c.policy_options.budget.ratio = 0.3;
  c.mode = Mode::Decode;
  c.protocol = Protocol::PrefillCompress;
  c.question = QuestionMode::Agnostic;
  c.shared_context = protocol;
  c.compare_with_full = false;
  return c;
}

}  // namespace

TEST_CASE("multi-request: each turn is its question's single run, bit for bit, forking where states agree",
          "[shared-context]") {
  auto model = Model::load(test::data("models/tiny-random-llama-gqa"), test::model_options());
  const TurnsRequest request = shared_context_request(static_cast<int>(model->arch().vocab));
  for (const std::string name : {"full", "h2o", "snapkv", "tova", "streamingllm", "ada+snapkv"}) {
    INFO("policy " << name);
    auto policy = make_policy(name, shared_context_budget(name, 12));
    int64_t saved = 0;
    const auto turns = generate_turns(*model, *policy, request, SharedContext::MultiRequest, {}, &saved);
    REQUIRE(turns.size() == 3);
    for (size_t k = 0; k < turns.size(); ++k) {
      const Generation alone = shared_context_alone(*model, *policy, request, k);
      CHECK(turns[k].tokens == alone.tokens);
      CHECK(turns[k].kv.kept_per_head == alone.kv.kept_per_head);
      CHECK(turns[k].kv.max_per_layer == alone.kv.max_per_layer);
      CHECK(turns[k].kv.peak_bytes == alone.kv.peak_bytes);
    }
    // Questions 1 and 2 have one length: the second continued a fork of the first's context.
    CHECK(saved == 1);
  }
}

TEST_CASE("multi-turn: turn 1 is the single run; later turns continue the same cache under the budget",
          "[shared-context]") {
  auto model = Model::load(test::data("models/tiny-random-llama-gqa"), test::model_options());
  const TurnsRequest request = shared_context_request(static_cast<int>(model->arch().vocab));
  const int budget = 12;
  const int layers = static_cast<int>(model->arch().n_layers);
  for (const std::string name : {"full", "h2o", "snapkv", "tova", "streamingllm"}) {
    INFO("policy " << name);
    auto policy = make_policy(name, shared_context_budget(name, budget));
    std::vector<std::vector<std::vector<std::vector<int>>>> held;  // [turn][layer][KV head]: positions
    std::vector<std::vector<int64_t>> cached;                      // [turn][layer]: rows
    const auto turns = generate_turns(*model, *policy, request, SharedContext::MultiTurn,
                                      [&](int, const GenerationStream& stream) {
                                        held.emplace_back();
                                        cached.emplace_back();
                                        for (int l = 0; l < layers; ++l) {
                                          held.back().push_back(stream.cache().kept_positions(l));
                                          cached.back().push_back(stream.cache().cached_tokens(l));
                                        }
                                      });
    REQUIRE(turns.size() == 3);
    REQUIRE(held.size() == 3);
    // (3) Turn 1 is the single-question run, so both protocols' first answers agree.
    const Generation first = shared_context_alone(*model, *policy, request, 0);
    CHECK(turns[0].tokens == first.tokens);
    CHECK(turns[0].kv.kept_per_head == first.kv.kept_per_head);
    const auto requests = generate_turns(*model, *policy, request, SharedContext::MultiRequest);
    CHECK(turns[0].tokens == requests[0].tokens);
    const int Q1 = static_cast<int>(request.questions[0].size());
    for (size_t k = 0; k < turns.size(); ++k) {
      INFO("turn " << k + 1);
      const int ran = shared_context_ran(request, turns, k);
      for (int l = 0; l < layers; ++l) {
        if (is_reference_policy(name)) {
          // The full cache holds every token the conversation ran, this turn's question and
          // the earlier turns' questions and answers.
          CHECK(cached[k][l] == ran);
          continue;
        }
        for (const std::vector<int>& head : held[k][l]) {
          // (4) The budget holds at every turn: the context's budget plus turn 1's question.
          CHECK(static_cast<int>(head.size()) <= budget + Q1);
          CHECK(std::is_sorted(head.begin(), head.end()));
          REQUIRE(!head.empty());
          // Every position held is one the conversation ran; a recent window holds the newest.
          CHECK(head.back() <= ran - 1);
          if (name != "tova") CHECK(head.back() == ran - 1);
          CHECK(head.front() >= 0);
          // Once the conversation holds more than that, the cache is full.
          if (name == "h2o" && k > 0) CHECK(static_cast<int>(head.size()) == budget + Q1);
        }
      }
    }
  }
}

TEST_CASE("multi-turn under a budget above the conversation holds every earlier question and answer",
          "[shared-context]") {
  auto model = Model::load(test::data("models/tiny-random-llama-gqa"), test::model_options());
  const TurnsRequest request = shared_context_request(static_cast<int>(model->arch().vocab));
  const int layers = static_cast<int>(model->arch().n_layers);
  for (const std::string name : {"h2o", "snapkv"}) {
    INFO("policy " << name);
    auto policy = make_policy(name, shared_context_budget(name, 100));  // the conversation is under 80 tokens
    std::vector<std::vector<std::vector<int>>> held;  // [turn][KV head of every layer]: positions
    const auto turns = generate_turns(*model, *policy, request, SharedContext::MultiTurn,
                                      [&](int, const GenerationStream& stream) {
                                        held.emplace_back();
                                        for (int l = 0; l < layers; ++l)
                                          for (const auto& head : stream.cache().kept_positions(l))
                                            held.back().push_back(head);
                                      });
    REQUIRE(held.size() == 3);
    for (size_t k = 0; k < turns.size(); ++k) {
      INFO("turn " << k + 1);
      // Positions 0 .. ran-1, every one: the context, each earlier question and answer
      // (the answer's last token fed before the next question), this turn's question and
      // answer so far.
      std::vector<int> all(shared_context_ran(request, turns, k));
      for (size_t p = 0; p < all.size(); ++p) all[p] = static_cast<int>(p);
      for (const auto& head : held[k]) CHECK(head == all);
    }
  }
}

TEST_CASE("multi-turn's later turns see the earlier turns: they differ from multi-request's", "[shared-context]") {
  // On the full cache the second turn's answer comes from context + q1 + a1 + q2 in one
  // cache against context + q2 alone: at least one later turn differs, or the earlier
  // turns would not be in the cache at all.
  auto model = Model::load(test::data("models/tiny-random-llama-gqa"), test::model_options());
  TurnsRequest request = shared_context_request(static_cast<int>(model->arch().vocab));
  for (GenerateOptions& options : request.options) options.top_logprobs = 0;
  auto policy = make_policy("full", PolicyOptions{});
  const auto multi_turn = generate_turns(*model, *policy, request, SharedContext::MultiTurn);
  const auto multi_request = generate_turns(*model, *policy, request, SharedContext::MultiRequest);
  bool differs = false;
  for (size_t k = 1; k < multi_turn.size(); ++k)
    differs = differs || multi_turn[k].chosen.front().logprob != multi_request[k].chosen.front().logprob;
  CHECK(differs);
  CHECK(multi_turn[0].chosen.front().logprob == multi_request[0].chosen.front().logprob);
}

TEST_CASE("shared-context eval scores every turn and writes per-turn rows that read back",
          "[shared-context][eval]") {
  const Model& model = test::stories();
  for (const std::string policy : {"full", "snapkv"}) {
    INFO("policy " << policy);
    const EvalConfig turn_config = shared_context_config(policy, SharedContext::MultiTurn, 2);
    const EvalConfig request_config = shared_context_config(policy, SharedContext::MultiRequest, 2);
    const EvalResult multi_turn = evaluate(model, turn_config);
    const EvalResult multi_request = evaluate(model, request_config);
    for (const EvalResult* result : {&multi_turn, &multi_request}) {
      REQUIRE(result->docs.size() == 2);
      // Overall (no turn), then each turn's string_match_all and string_match_part.
      REQUIRE(result->metrics.size() == 6);
      CHECK(!result->metrics[0].turn);
      CHECK(result->metrics[0].name == "string_match_all");
      CHECK(result->metrics[2].turn == 1);
      CHECK(result->metrics[4].turn == 2);
      CHECK(result->metrics[4].name == "string_match_all");
      CHECK(result->metrics[0].n == 4);
      CHECK(result->metrics[2].n == 2);
      for (const DocOutcome& doc : result->docs) {
        REQUIRE(doc.long_context);
        REQUIRE(doc.turn_answers.size() == 2);
        for (int k = 0; k < 2; ++k)
          CHECK(doc.turn_scores[k] == 100 * string_match_all_fraction(ruler_postprocess(doc.turn_answers[k]),
                                                                      doc.long_context->turns[k].references));
      }
    }
    // Multi-request's turn k is the single-question run of question k, prompts split as
    // the agnostic protocol splits them; multi-turn's first turn too.
    for (size_t d = 0; d < multi_request.docs.size(); ++d) {
      const GenerationDoc& doc = *multi_request.docs[d].long_context;
      const std::string context_text = doc.prompt.substr(0, *doc.question_offset);
      const std::vector<int> context = model.encode(context_text, true);
      for (int k = 0; k < 2; ++k) {
        const std::vector<int> prompt = model.encode(context_text + doc.turns[k].question, true);
        size_t shared = 0;
        while (shared < context.size() && context[shared] == prompt[shared]) ++shared;
        GenerateOptions options;
        options.max_new_tokens = doc.turns[k].max_new_tokens;
        options.question_tokens = static_cast<int>(prompt.size() - shared);
        auto p = make_policy(request_config.policy, request_config.policy_options);
        CHECK(multi_request.docs[d].turn_answers[k] == generate(model, *p, prompt, options).text);
      }
      CHECK(multi_turn.docs[d].turn_answers[0] == multi_request.docs[d].turn_answers[0]);
    }
    // The rows: the protocol and the turn count as settings, each turn's rows by its index.
    const std::string path = test::temp_dir("shared-context-rows") + "/results.csv";
    append_rows_durably(path, eval_rows("stories260K", turn_config, multi_turn));
    append_rows_durably(path, eval_rows("stories260K", request_config, multi_request));
    const auto rows = read_results_csv(path);
    REQUIRE(rows.size() == 12);
    int per_turn = 0;
    for (const ResultRow& row : rows) {
      CHECK(row.turns == 2);
      CHECK((row.shared_context == "multi-turn" || row.shared_context == "multi-request"));
      if (row.turn) {
        ++per_turn;
        CHECK((*row.turn == 1 || *row.turn == 2));
        CHECK(row.n == 2);
      }
    }
    CHECK(per_turn == 8);
    CHECK(rows[2].turn == 1);
    CHECK(rows[2].value == multi_turn.metrics[2].value);
    CHECK(rows[10].turn == 2);
    CHECK(rows[10].shared_context == "multi-request");
  }
}

TEST_CASE("shared-context eval refuses what it cannot run, naming the flag", "[shared-context][eval][errors]") {
  const Model& model = test::stories();
  auto error = [&](EvalConfig c) { return test::error_of([&] { evaluate(model, c); }); };
  EvalConfig c = shared_context_config("full", SharedContext::None, 2);
  CHECK_THAT(error(c), Catch::Contains("--turns needs --shared-context"));
  c = shared_context_config("full", SharedContext::MultiTurn, 0);
  CHECK_THAT(error(c), Catch::Contains("--shared-context needs --turns"));
  c = shared_context_config("full", SharedContext::MultiTurn, -1);
  CHECK_THAT(error(c), Catch::Contains("--turns -1"));
  c = shared_context_config("full", SharedContext::MultiTurn, 2);
  c.task = "ruler_niah_single_1";  // one key: one question
  CHECK_THAT(error(c), Catch::Contains("--turns 2") && Catch::Contains("asks 1 question"));
  c = shared_context_config("full", SharedContext::MultiRequest, 2);
  c.question = QuestionMode::Aware;
  CHECK_THAT(error(c), Catch::Contains("--question agnostic"));
  c = shared_context_config("full", SharedContext::MultiRequest, 2);
  c.task = "copa";
  c.task_options.length = 0;
  CHECK_THAT(error(c), Catch::Contains("--turns") && Catch::Contains("copa"));
  c = shared_context_config("h2o-paper", SharedContext::MultiTurn, 2);
  CHECK_THAT(error(c), Catch::Contains("sim-only"));
}

TEST_CASE("a sweep's turns and shared_contexts make one cell per protocol, refused where they cannot run",
          "[shared-context][sweep]") {
  auto config = nlohmann::json::parse(R"({
    "tasks": ["ruler_niah_multikey_2"], "policies": ["full", "snapkv"], "budgets": [0.2],
    "protocols": ["prefill-compress"], "lengths": [500], "questions": ["agnostic"],
    "turns": 2, "shared_contexts": ["multi-turn", "multi-request"], "mode": "decode"})");
  const auto plan = expand_sweep(config, "sweep.json", test::data(""));
  REQUIRE(plan.cells.size() == 4);
  std::set<std::string> keys;
  int multi_turn = 0;
  for (const auto& cell : plan.cells) {
    keys.insert(cell.key());
    CHECK(cell.eval.task_options.turns == 2);
    multi_turn += cell.eval.shared_context == SharedContext::MultiTurn;
    CHECK(identity_row("m", cell.eval).turns == 2);
  }
  CHECK(multi_turn == 2);
  CHECK(keys.size() == 4);  // the protocol is part of a cell's identity
  auto refused = [](const std::string& text) {
    return test::error_of([&] { expand_sweep(nlohmann::json::parse(text), "sweep.json", test::data("")); });
  };
  CHECK_THAT(refused(R"({"tasks": ["ruler_niah_multikey_2"], "policies": ["full"], "protocols": ["prefill-compress"],
                         "lengths": [500], "questions": ["agnostic"], "turns": 2})"),
             Catch::Contains("\"turns\" and \"shared_contexts\" go together"));
  CHECK_THAT(refused(R"({"tasks": ["ruler_niah_multikey_2"], "policies": ["full"], "protocols": ["prefill-compress"],
                         "lengths": [500], "turns": 2, "shared_contexts": ["multi-turn"]})"),
             Catch::Contains("\"questions\": [\"agnostic\"]"));
  CHECK_THAT(refused(R"({"tasks": ["ruler_niah_multikey_2"], "policies": ["full"], "protocols": ["prefill-compress"],
                         "lengths": [500], "questions": ["agnostic"], "turns": 2, "shared_contexts": ["both"]})"),
             Catch::Contains("shared_contexts") && Catch::Contains("multi-turn"));
  CHECK_THAT(refused(R"({"tasks": ["copa"], "policies": ["full"], "protocols": ["prefill-compress"],
                         "questions": ["agnostic"], "turns": 2, "shared_contexts": ["multi-turn"]})"),
             Catch::Contains("applies to the long-context tasks"));
}
