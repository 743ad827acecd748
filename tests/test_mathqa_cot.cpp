// mathqa_cot, MathQA as chain-of-thought generation: the prompt layout on a hand-made
// file, the answer-letter rule on hand-made generations, the mojibake repair, the real
// file's cleaning, and stories260K runs under the full cache and decoding+h2o.
//
// The hand-made file's few-shot draws are Python 3.11's: with file order (no shuffle),
//   r = random.Random(42); [r.sample(range(3), 2) for _ in range(3)] == [[2, 0], [0, 1], [0, 2]]
// so with one shot item 0 is shown item 2, items 1 and 2 are shown item 0.
#include <filesystem>
#include <fstream>

#include "harness/common/errors.h"
#include "harness/eval/evaluator.h"
#include "harness/model/model.h"
#include "tasks/mathqa_cot.h"
#include "tasks/task.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

nlohmann::json cot_item(const std::string& problem, const std::string& options, const std::string& rationale,
                        const std::string& correct) {
  return {{"Problem", problem}, {"Rationale", rationale}, {"options", options}, {"correct", correct},
          {"annotated_formula", "f"}, {"linear_formula", "l"}, {"category", "general"}};
}

// A data folder holding mathqa/test.json with `items`.
std::string cot_data_dir(const std::string& name, const nlohmann::json& items) {
  const std::string dir = test::temp_dir(name);
  std::filesystem::create_directories(dir + "/mathqa");
  std::ofstream(dir + "/mathqa/test.json", std::ios::binary) << items.dump(4);
  return dir;
}

nlohmann::json cot_three_items() {
  return nlohmann::json::array(
      {cot_item("what is 2 + 2 ?", "a ) 3 , b ) 4 , c ) 5 , d ) 6 , e ) 7", "\"2 + 2 = 4 . answer b\"", "b"),
       cot_item("what is 3 \u00e3 \u2014 2 ?", "['a ) 5', 'b ) 6', 'c ) 7', 'd ) 8', 'e ) 9']",
                "\"3 \u00e3 \u2014 2 = 6 answer : b\"", "b"),
       cot_item("what is 9 / 3 ?", "a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5", "\"9 / 3 = 3\"", "c")});
}

TaskOptions cot_options(const std::string& data_dir, int shots, int limit) {
  TaskOptions options;
  options.data_dir = data_dir;
  options.shots = shots;
  options.limit = limit;
  return options;
}

}  // namespace

TEST_CASE("mathqa_cot prompts: few-shot examples with their rationale and answer, then the query", "[tasks][mathqa_cot]") {
  TaskOptions options = cot_options(cot_data_dir("mathqa_cot_layout", cot_three_items()), 1, -1);
  options.lm_eval_shuffle = false;
  const auto task = make_task("mathqa_cot");
  CHECK(task->kind() == TaskKind::Generation);
  CHECK(task->metric_names() == std::vector<std::string>{"exact_match", "answer_found"});
  const auto docs = task->generation_docs(options);
  REQUIRE(docs.size() == 3);
  const std::string example0 =
      "Question: what is 2 + 2 ?\nOptions: a ) 3 , b ) 4 , c ) 5 , d ) 6 , e ) 7\nRationale: 2 + 2 = 4 . answer b\nAnswer: b";
  const std::string example2 =
      "Question: what is 9 / 3 ?\nOptions: a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5\nRationale: 9 / 3 = 3\nAnswer: c";
  CHECK(docs[0].prompt == example2 + "\n\nQuestion: what is 2 + 2 ?\nOptions: a ) 3 , b ) 4 , c ) 5 , d ) 6 , e ) 7\nRationale:");
  // Item 1: the mojibake "ã —" is "×" again and its Python-list options read like the others.
  CHECK(docs[1].prompt == example0 + "\n\nQuestion: what is 3 \u00d7 2 ?\nOptions: a ) 5 , b ) 6 , c ) 7 , d ) 8 , e ) 9\nRationale:");
  CHECK(docs[2].prompt == example0 + "\n\nQuestion: what is 9 / 3 ?\nOptions: a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5\nRationale:");
  for (size_t i = 0; i < docs.size(); ++i) {
    CHECK(docs[i].id == std::to_string(i));
    CHECK(docs[i].stop == std::vector<std::string>{"\nQuestion:"});
    CHECK(docs[i].max_new_tokens == 256);
  }
  CHECK(docs[0].reference == "b");
  CHECK(docs[2].reference == "c");
  // Item 1 as an example: two shots give item 0 the other two (sample(3, 3) minus itself).
  MathQaCotItem cleaned{"what is 3 \u00d7 2 ?", "a ) 5 , b ) 6 , c ) 7 , d ) 8 , e ) 9", "3 \u00d7 2 = 6 answer : b", 'b'};
  options.shots = 2;
  const auto two_shot = task->generation_docs(options);
  CHECK(two_shot[0].prompt.find(mathqa_cot_query(cleaned) + mathqa_cot_target(cleaned) + "\n\n") != std::string::npos);
  for (const auto& doc : two_shot) {
    INFO("item " << doc.id);
    // An item is never its own example: its query (after the last blank line) appears once.
    const std::string query = doc.prompt.substr(doc.prompt.rfind("\n\n") + 2);
    CHECK(doc.prompt.find(query) == doc.prompt.size() - query.size());
  }
}

TEST_CASE("mathqa_cot reads the answer letter after the last \"answer\"", "[tasks][mathqa_cot]") {
  const std::vector<std::pair<std::string, std::optional<char>>> cases = {
      {" 2 + 2 = 4\nAnswer: b", 'b'},
      {"so the answer is ( d ) .", 'd'},
      {"answer : option e", 'e'},
      {"ANSWER IS C", 'c'},
      {"answer = a , done", 'a'},
      {"answer:(e)", 'e'},
      {"answer is : b", 'b'},
      {"first answer a then\nAnswer: d", 'd'},  // the last one counts
      {"answer a\nanswer 12", 'a'},             // a later "answer" without a letter does not undo one
      {"the answer is 12", std::nullopt},
      {"answer: apple", std::nullopt},           // a word, not a letter
      {"answer f", std::nullopt},                // not an option
      {"answers c", std::nullopt},               // "answer" must be a whole word
      {"c is the answer .", std::nullopt},       // the letter must follow
      {"option c", std::nullopt},
      {"", std::nullopt},
      {"once upon a time there was a cat", std::nullopt},
  };
  for (const auto& [generation, letter] : cases) {
    INFO(generation);
    CHECK(mathqa_cot_answer_letter(generation) == letter);
  }

  // Scoring: exact match of the letter (no letter is wrong), and whether one was found.
  const auto task = make_task("mathqa_cot");
  std::vector<GenerationDoc> docs(4);
  for (size_t i = 0; i < docs.size(); ++i) docs[i].reference = std::string(1, "bcae"[i]);
  const auto scores = task->score_generations(docs, {"answer b", "answer : d", "no idea", "the answer is ( e )"});
  REQUIRE(scores.has_value());
  CHECK(scores->per_doc == std::vector<double>{1, 0, 0, 1});
  REQUIRE(scores->metrics.size() == 2);
  CHECK(scores->metrics[0].name == "exact_match");
  CHECK(scores->metrics[0].value == Approx(0.5));
  CHECK(scores->metrics[0].n == 4);
  CHECK(scores->metrics[1].name == "answer_found");
  CHECK(scores->metrics[1].value == Approx(0.75));
  CHECK_THAT(test::error_of([&] { task->score_generations(docs, {"a"}); }), Catch::Contains("1 predictions for 4"));
}

TEST_CASE("mathqa_cot repairs MathQA's spaced, lowercased mojibake and leaves real text alone", "[tasks][mathqa_cot]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"100 \u00e3 \u2014 ( 100 + 31.1 )", "100 \u00d7 ( 100 + 31.1 )"},  // ã — -> ×  (C3 97)
      {"138 \u00e2 \u20ac \u201c 100", "138 \u2013 100"},                // â € “ -> –  (E2 80 93)
      {"\u00e2 \u02c6 \u2019 5", "\u2212 5"},                            // â ˆ ’ -> −  (E2 88 92)
      {"2 \u00ef \u20ac r", "2 \u03c0 r"},                               // ï € -> π  (Ï€: CF 80)
      {"\u00e2 \u20ac \u0153 hi \u00e2 \u20ac \u009d", "\u201c hi \u201d"},  // 9D: a sloppy-1252 byte
      {"x \u00e2 \u00b3 \u00e2 \u02c6 \u0161", "x \u00b3 \u221a"},       // Â³ then √ in one run
      {"a \u00e2 \u00b2", "a \u00b2"},                                   // Â² (the â is C2 here)
  };
  for (const auto& [text, repaired] : cases) {
    INFO(text);
    CHECK(repair_spaced_mojibake(text) == repaired);
  }
  for (const std::string same : {"\u00d7 \u03c0 \u00d7", "\u00d7 \u00b2", "ge \u00e6 \u00ab ng", "\u221a \u03c0",
                                 "caf\u00e9 au lait", "plain ascii", "\u00e3", "3 \u00e3 x"}) {
    INFO(same);
    CHECK(repair_spaced_mojibake(same) == same);
  }
}

TEST_CASE("mathqa_cot on the real file: cleaned text, every item, never its own example", "[tasks][mathqa_cot]") {
  TaskOptions options = cot_options(test::data(""), 1, -1);
  options.lm_eval_shuffle = false;
  const auto docs = make_task("mathqa_cot")->generation_docs(options);
  REQUIRE(docs.size() == 2985);
  int with_mojibake = 0, with_list_options = 0, with_quoted_rationale = 0;
  for (const auto& doc : docs) {
    with_mojibake += doc.prompt.find("\u00e3 \u2014") != std::string::npos || doc.prompt.find("\u00e2 \u20ac") != std::string::npos;
    with_list_options += doc.prompt.find("Options: ['") != std::string::npos;
    with_quoted_rationale += doc.prompt.find("Rationale: \"") != std::string::npos;
  }
  CHECK(with_mojibake == 0);
  // The repair touches what the README says it does (counted in Python by the same rule).
  int problems_repaired = 0, rationales_repaired = 0, options_repaired = 0;
  for (const auto& item : test::read_json(test::data("mathqa/test.json"))) {
    for (const auto& [field, count] : {std::pair<const char*, int*>{"Problem", &problems_repaired},
                                       {"Rationale", &rationales_repaired}, {"options", &options_repaired}}) {
      const std::string text = item.at(field).get<std::string>();
      *count += repair_spaced_mojibake(text) != text;
    }
  }
  CHECK(problems_repaired == 13);
  CHECK(rationales_repaired == 102);
  CHECK(options_repaired == 0);
  CHECK(with_list_options == 0);
  CHECK(with_quoted_rationale == 0);
  // Item 0 (correct "a") as the query, and its answer.
  CHECK(docs[0].reference == "a");
  CHECK(docs[0].prompt.size() > 200);
  const std::string query0 =
      "Question: a shopkeeper sold an article offering a discount of 5 % and earned a profit of 31.1 % . what would "
      "have been the percentage of profit earned if no discount had been offered ?\nOptions: a ) 38 , b ) 27.675 , "
      "c ) 30 , d ) data inadequate , e ) none of these\nRationale:";
  CHECK(docs[0].prompt.substr(docs[0].prompt.size() - query0.size()) == query0);
  CHECK(docs[0].prompt.find(query0) == docs[0].prompt.size() - query0.size());
  // Item 0 as someone's example: its rationale with ×, − and – repaired, unquoted.
  const std::string rationale0 =
      "Rationale: giving no discount to customer implies selling the product on printed price . suppose the cost "
      "price of the article is 100 . then printed price = 100 \u00d7 ( 100 + 31.1 ) / ( 100 \u2212 5 ) = 138 hence , "
      "required % profit = 138 \u2013 100 = 38 % answer a\nAnswer: a\n\n";
  // Python: r = random.Random(42); item 0 is the one example only of item 2575, whose
  // r.sample(range(2985), 2) is the 2576th draw.
  CHECK(docs[2575].prompt.rfind("Question: a shopkeeper sold", 0) == 0);
  CHECK(docs[2575].prompt.find(rationale0) != std::string::npos);
  CHECK_THAT(test::error_of([&] {
               TaskOptions h2o = options;
               h2o.pipeline = Pipeline::H2O;
               make_task("mathqa_cot")->generation_docs(h2o);
             }),
             Catch::Contains("--pipeline"));
  CHECK_THAT(test::error_of([&] {
               make_task("mathqa_cot")->generation_docs(cot_options(cot_data_dir("mathqa_cot_bad", nlohmann::json::array(
                   {cot_item("p", "a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5", "r", "f")})), 0, -1));
             }),
             Catch::Contains("item 0: correct \"f\""));
}

TEST_CASE("mathqa_cot runs on stories260K under the full cache and decoding+h2o", "[tasks][mathqa_cot][eval][decoding]") {
  constexpr int kNewTokens = 40, kInterval = 16, kTarget = 24;
  for (const std::string policy : {"full", "decoding+h2o"}) {
    INFO(policy);
    EvalConfig config;
    config.task = "mathqa_cot";
    config.task_options = cot_options(test::data(""), 1, 3);
    config.policy = policy;
    config.mode = Mode::Decode;
    config.protocol = Protocol::PrefillCompress;  // the prompt is the prefill, as the configs run it
    config.max_length = 512;
    config.max_new_tokens = kNewTokens;
    config.compare_with_full = policy != "full";
    if (policy != "full") {
      config.policy_options.params.set("decode_interval", kInterval);
      config.policy_options.params.set("decode_target", kTarget);
    }
    const EvalResult result = evaluate(test::stories(), config);
    CHECK(result.n == 3);
    REQUIRE(result.metrics.size() == 2);
    CHECK(result.metrics[0].name == "exact_match");
    CHECK(result.metrics[1].name == "answer_found");
    for (const auto& m : result.metrics) CHECK((m.value >= 0 && m.value <= 1));
    if (policy != "full") CHECK(result.agreement_with_full.has_value());
    // Its predictions carry the task's score and the gold letter, not ROUGE.
    const std::string predictions = test::temp_dir("mathqa_cot_predictions") + "/p.jsonl";
    write_predictions(result, config, predictions);
    std::ifstream lines(predictions);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
      const nlohmann::json row = nlohmann::json::parse(line);
      CHECK(row.at("score").get<double>() == result.docs.at(rows).score);
      CHECK(row.at("reference").get<std::string>().size() == 1);
      CHECK_FALSE(row.contains("rouge1"));
      ++rows;
    }
    CHECK(rows == 3);

    // The same generations, one by one: at most kNewTokens each, and decoding+h2o's cache
    // at most the prompt plus one interval (no budget: the prompt enters whole).
    const auto docs = make_task("mathqa_cot")->generation_docs_for(test::stories().require_tokenizer(), config.task_options);
    REQUIRE(docs.size() == 3);
    const auto made = make_policy(policy, config.policy_options);
    for (size_t d = 0; d < docs.size(); ++d) {
      std::vector<int> prompt = test::stories().encode(docs[d].prompt, true);
      if (prompt.size() > 512 - kNewTokens) prompt.erase(prompt.begin(), prompt.end() - (512 - kNewTokens));
      GenerateOptions g;
      g.max_new_tokens = kNewTokens;
      g.stop = docs[d].stop;
      const Generation generation = generate(test::stories(), *made, prompt, g);
      CHECK(generation.tokens.size() <= static_cast<size_t>(kNewTokens));
      CHECK(generation.text == result.docs[d].generated);
      for (int most : generation.kv.max_per_layer) {
        if (policy == "full") CHECK(most <= static_cast<int>(prompt.size()) + kNewTokens);
        else CHECK(most <= static_cast<int>(prompt.size()) + kInterval);
      }
      if (policy != "full" && generation.tokens.size() >= static_cast<size_t>(kInterval))
        for (int kept : generation.kv.kept_per_layer) CHECK(kept <= kTarget + kInterval);
    }
  }
}
