// MathQA (lm-eval 0.3) and CNN/DailyMail (H2O's request file and HELM's prompt): requests
// from the real data, the stories260K MathQA golden, both CNN/DM pipelines end to end,
// and the errors bad input gives.
//
// Hand-checked expectations come from the data files and Python 3.11:
//   re.findall(r"[abcd] \) .*?, |e \) .*?$", options), c[4:].rstrip(" ,")  (lm-eval's parse)
//   random.Random(42).sample(range(100), 2) == [81, 14]                   (the CNN/DM pool)
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/common/errors.h"
#include "harness/eval/evaluator.h"
#include "harness/model/model.h"
#include "harness/sweep/sweep.h"
#include "tasks/jsonl.h"
#include "tasks/task.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::error_of;

namespace {

TaskOptions real_data() {
  TaskOptions options;
  options.data_dir = test::data("");
  return options;
}

std::vector<MultipleChoiceDoc> mathqa_in_file_order(TaskOptions options = real_data()) {
  options.lm_eval_shuffle = false;
  return make_task("mathqa")->multiple_choice_docs(options);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A MathQA item in the official file's layout.
nlohmann::json mathqa_item(const std::string& problem, const std::string& options,
                           const std::string& correct) {
  return {{"Problem", problem}, {"Rationale", "r"}, {"options", options}, {"correct", correct},
          {"annotated_formula", "f"}, {"linear_formula", "l"}, {"category", "general"}};
}

const char* kFiveOptions = "a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5";

}  // namespace

// ---------------------------------------------------------------------------------------
// MathQA

TEST_CASE("MathQA requests match lm-eval 0.3", "[tasks][mathqa]") {
  const auto docs = mathqa_in_file_order();
  REQUIRE(docs.size() == 2985);
  const MultipleChoiceDoc& first = docs[0];
  CHECK(first.id == "0");
  CHECK(first.gold == 0);  // correct "a"
  CHECK(first.choice_texts ==
        std::vector<std::string>{"38", "27.675", "30", "data inadequate", "none of these"});
  REQUIRE(first.requests.size() == 5);
  CHECK(first.requests[0].context ==
        "Question: a shopkeeper sold an article offering a discount of 5 % and earned a profit of "
        "31.1 % . what would have been the percentage of profit earned if no discount had been "
        "offered ?\nAnswer:");
  CHECK(first.requests[0].continuation == " 38");
  CHECK(first.requests[3].continuation == " data inadequate");

  // lm-eval 0.3 shuffles with random.Random(42) by default; ids keep the file index.
  const auto shuffled = make_task("mathqa")->multiple_choice_docs(real_data());
  REQUIRE(shuffled.size() == 2985);
  CHECK(shuffled[0].id != "0");
  CHECK(docs[std::stoul(shuffled[0].id)].requests[0].context == shuffled[0].requests[0].context);
}

TEST_CASE("MathQA's Python-list options parse as lm-eval parses them", "[tasks][mathqa]") {
  // 66 official items hold "['a ) ...', 'b ) ...', ...]"; lm-eval's regex keeps the quote
  // before each ", " and the closing "']" on the last choice.
  const auto docs = mathqa_in_file_order();
  // options "['a ) 2 : 3', 'b ) 4 : 5', 'c ) 16 : 9', 'd ) 7 : 9', 'e ) 8 : 5']", correct c
  CHECK(docs[82].choice_texts ==
        std::vector<std::string>{"2 : 3'", "4 : 5'", "16 : 9'", "7 : 9'", "8 : 5']"});
  CHECK(docs[82].gold == 2);
  CHECK(docs[82].requests[4].continuation == " 8 : 5']");
  // options "['a ) 12', 'b ) 15', 'c ) 10', 'd ) 8', 'e ) 14']", correct a
  CHECK(docs[95].choice_texts == std::vector<std::string>{"12'", "15'", "10'", "8'", "14']"});
  CHECK(docs[95].gold == 0);
  // options "['a ) 15 ohms', 'b ) 15 / 8 ohms', 'c ) 1 / 8 ohms', 'd ) 8 / 15 ohms',
  // 'e ) 8 ohms']", correct b
  CHECK(docs[188].choice_texts == std::vector<std::string>{"15 ohms'", "15 / 8 ohms'",
                                                           "1 / 8 ohms'", "8 / 15 ohms'",
                                                           "8 ohms']"});
  CHECK(docs[188].gold == 1);
  // acc_norm divides by these lengths, quotes included: "12'" is 3 characters.
  CHECK(docs[95].choice_texts[0].size() == 3);
  // All 66 list-string items end their last choice with the list's "']" (SOURCES.md).
  size_t listed = 0;
  for (const auto& doc : docs) {
    const std::string& last = doc.choice_texts.back();
    listed += last.size() >= 2 && last.compare(last.size() - 2, 2, "']") == 0;
  }
  CHECK(listed == 66);
}

TEST_CASE("MathQA matches the stories260K golden (documents 0-99, file order)",
          "[tasks][mathqa][golden]") {
  const auto golden = test::read_json(test::data("golden/mathqa_stories260K_docs0-99.json"));
  EvalConfig config;
  config.task = "mathqa";
  config.task_options = real_data();
  config.task_options.lm_eval_shuffle = false;
  config.task_options.limit = 100;
  config.compare_with_full = false;
  const EvalResult result = evaluate(test::stories(), config);
  REQUIRE(result.docs.size() == 100);
  const auto docs = mathqa_in_file_order();
  std::vector<double> got, want;  // every document's choice scores, in order
  for (size_t i = 0; i < result.docs.size(); ++i) {
    const DocOutcome& outcome = result.docs[i];
    INFO("document " << i);
    REQUIRE(outcome.id == std::to_string(i));
    const auto& expected = golden["docs"][outcome.id];
    CHECK(outcome.gold == expected["gold"].get<int>());
    CHECK(docs[i].choice_texts == expected["choices"].get<std::vector<std::string>>());
    const auto scores = expected["scores"].get<std::vector<double>>();
    REQUIRE(outcome.choice_scores.size() == scores.size());
    got.insert(got.end(), outcome.choice_scores.begin(), outcome.choice_scores.end());
    want.insert(want.end(), scores.begin(), scores.end());
  }
  CHECK(test::max_diff(got, want) < 1e-3);  // golden/README.md: a float32 implementation within 1e-3
  REQUIRE(result.metrics.size() == 2);
  CHECK(result.metrics[0].name == "acc");
  CHECK(result.metrics[1].name == "acc_norm");
  // 100 documents: equal counts of correct answers give equal means.
  CHECK(std::lround(100 * result.metrics[0].value) == std::lround(100 * golden["acc"].get<double>()));
  CHECK(std::lround(100 * result.metrics[1].value) ==
        std::lround(100 * golden["acc_norm"].get<double>()));
}

TEST_CASE("few-shot MathQA needs the train split", "[tasks][mathqa][errors]") {
  SECTION("the shipped data has none: a one-line error") {
    TaskOptions options = real_data();
    options.shots = 1;
    const std::string message = error_of([&] { make_task("mathqa")->multiple_choice_docs(options); });
    CHECK_THAT(message, Catch::Contains("train split, which is not available"));
    CHECK_THAT(message, Catch::Contains(test::data("mathqa/train.json")));
    CHECK(message.find('\n') == std::string::npos);

    const auto cli = test::run_kvevict("eval --task mathqa --shots 1 --limit 2");
    CHECK(cli.exit_code != 0);
    CHECK_THAT(cli.err, Catch::Contains("train split, which is not available"));
  }
  SECTION("with a train file, examples are drawn as lm-eval 0.3 draws them") {
    const std::string dir = test::temp_dir("mathqa_fewshot");
    std::filesystem::create_directories(dir + "/mathqa");
    nlohmann::json test = nlohmann::json::array(), train = nlohmann::json::array();
    for (int i = 0; i < 3; ++i) test.push_back(mathqa_item("test " + std::to_string(i) + "?", kFiveOptions, "b"));
    for (int i = 0; i < 10; ++i)
      train.push_back(mathqa_item("train " + std::to_string(i) + "?", kFiveOptions, i % 2 ? "e" : "a"));
    write_file(dir + "/mathqa/test.json", test.dump(4));
    write_file(dir + "/mathqa/train.json", train.dump(4));
    TaskOptions options;
    options.data_dir = dir;
    options.shots = 2;
    const auto docs = make_task("mathqa")->multiple_choice_docs(options);
    // r = random.Random(42); order = [0, 1, 2]; r.shuffle(order) -> [1, 0, 2]; then per
    // document r.sample(train, 2): [0, 4], [3, 9], [2, 1].
    auto example = [](int i) {
      return "Question: train " + std::to_string(i) + "?\nAnswer: " + (i % 2 ? "5" : "1");
    };
    const std::vector<std::pair<std::string, std::vector<int>>> expected = {
        {"1", {0, 4}}, {"0", {3, 9}}, {"2", {2, 1}}};
    REQUIRE(docs.size() == 3);
    for (size_t d = 0; d < docs.size(); ++d) {
      CHECK(docs[d].id == expected[d].first);
      const auto& picks = expected[d].second;
      CHECK(docs[d].requests[0].context == example(picks[0]) + "\n\n" + example(picks[1]) +
                                               "\n\nQuestion: test " + expected[d].first +
                                               "?\nAnswer:");
      CHECK(docs[d].gold == 1);
    }
  }
}

TEST_CASE("malformed MathQA items name the file and item", "[tasks][mathqa][errors]") {
  const std::string dir = test::temp_dir("mathqa_bad");
  std::filesystem::create_directories(dir + "/mathqa");
  const std::string path = dir + "/mathqa/test.json";
  TaskOptions options;
  options.data_dir = dir;
  auto load_error = [&](const nlohmann::json& items) {
    write_file(path, items.dump(4));
    return error_of([&] { make_task("mathqa")->multiple_choice_docs(options); });
  };
  const auto good = mathqa_item("q?", kFiveOptions, "a");

  std::string message =
      load_error(nlohmann::json::array({good, mathqa_item("q?", "a ) 1 , b ) 2 , c ) 3 , e ) 5", "a")}));
  CHECK_THAT(message, Catch::Contains(path + ": item 1: options"));
  CHECK_THAT(message, Catch::Contains("give 4 choices"));
  // A newline inside the options does not break the one-line message.
  message = load_error(nlohmann::json::array({mathqa_item("q?", "a ) 1 ,\nb ) 2", "a")}));
  CHECK_THAT(message, Catch::Contains(path + ": item 0: options \"a ) 1 ,\\nb ) 2\""));
  CHECK(message.find('\n') == std::string::npos);

  auto listed = good;
  listed["options"] = {"a ) 1", "b ) 2", "c ) 3", "d ) 4", "e ) 5"};
  CHECK_THAT(load_error(nlohmann::json::array({good, good, listed})),
             Catch::Contains(path + ": item 2: field \"options\" must be a string"));
  auto no_problem = good;
  no_problem.erase("Problem");
  CHECK_THAT(load_error(nlohmann::json::array({no_problem})), Catch::Contains(path + ": item 0: field \"Problem\""));
  CHECK_THAT(load_error(nlohmann::json::array({good, mathqa_item("q?", kFiveOptions, "f")})),
             Catch::Contains(path + ": item 1: correct \"f\" out of range"));
  CHECK_THAT(load_error(nlohmann::json::object()), Catch::Contains(path + ": expected a JSON array"));
  write_file(path, "[{\"Problem\": ");
  CHECK_THAT(error_of([&] { make_task("mathqa")->multiple_choice_docs(options); }),
             Catch::Contains(path + ": malformed JSON"));
}

// ---------------------------------------------------------------------------------------
// CNN/DailyMail

namespace {

const std::string kCnnPrefix = "###\nArticle: ";
const std::string kHelmCnnInstruction = "\n\nSummarize the above article in 3 sentences.\n";

// Document 0's article without the prefix, cut to its first `words` words (it is ASCII
// with single spaces, so istringstream's split is Python's str.split here).
std::string first_words(const std::string& article, size_t words) {
  std::istringstream in(article);
  std::string word, out;
  for (size_t n = 0; n < words && in >> word; ++n) out += (out.empty() ? "" : " ") + word;
  return out;
}

TaskOptions cnndm_options(Pipeline pipeline, int shots = 0, int limit = -1) {
  TaskOptions options = real_data();
  options.pipeline = pipeline;
  options.shots = shots;
  options.limit = limit;
  return options;
}

}  // namespace

TEST_CASE("CNN/DM prompt for document 0 in the H2O pipeline: the file as it is", "[tasks][cnndm]") {
  const auto rows = read_jsonl(test::data("cnndm/cnndm_0shot.jsonl"));
  REQUIRE(rows.size() == 1000);
  const auto docs = make_task("cnndm")->generation_docs(cnndm_options(Pipeline::H2O));
  REQUIRE(docs.size() == 1000);
  const std::string& prompt = docs[0].prompt;
  CHECK(prompt == rows[0].string_field("article"));
  CHECK(prompt.rfind("###\nArticle: (CNN)The Palestinian Authority officially became the 123rd "
                     "member of the International Criminal Court on We",
                     0) == 0);
  const std::string tail =
      "crimes. CNN's Vasco Cotovio, Kareem Khadder and Faith Karimi contributed to this report.";
  REQUIRE(prompt.size() > tail.size());
  CHECK(prompt.substr(prompt.size() - tail.size()) == tail);  // no instruction, no cut
  CHECK(docs[0].id == "0");
  CHECK(docs[0].reference == rows[0].string_field("summary_gt"));
  CHECK(docs[0].max_new_tokens == 64);
  CHECK(docs[0].stop == std::vector<std::string>{"###"});
  REQUIRE(docs[0].temperature.has_value());
  CHECK(*docs[0].temperature == 0.3);
  CHECK(make_task("cnndm")->generation_docs(cnndm_options(Pipeline::H2O, 0, 3)).size() == 3);
}

TEST_CASE("CNN/DM prompt for document 0 in the lm-eval pipeline: HELM's", "[tasks][cnndm]") {
  const auto rows = read_jsonl(test::data("cnndm/cnndm_0shot.jsonl"));
  const std::string article = rows[0].string_field("article").substr(kCnnPrefix.size());
  const auto docs = make_task("cnndm")->generation_docs(cnndm_options(Pipeline::LmEval));
  REQUIRE(docs.size() == 1000);
  // Document 0 has 567 words; HELM keeps the first 512, which end "... The war".
  const std::string expected = kCnnPrefix + first_words(article, 512) + kHelmCnnInstruction;
  CHECK(docs[0].prompt == expected);
  const std::string tail =
      "Prosecutor Fatou Bensouda said her office would \"conduct its analysis in full "
      "independence and impartiality.\" The war\n\nSummarize the above article in 3 sentences.\n";
  CHECK(docs[0].prompt.substr(docs[0].prompt.size() - tail.size()) == tail);
  CHECK(docs[0].prompt.rfind("###\nArticle: (CNN)The Palestinian Authority officially", 0) == 0);
  CHECK(docs[0].reference == rows[0].string_field("summary_gt"));
  CHECK(docs[0].max_new_tokens == 128);
  CHECK(docs[0].stop == std::vector<std::string>{"###"});
  CHECK_FALSE(docs[0].temperature.has_value());  // the run's --temperature
}

TEST_CASE("CNN/DM few-shot: the reserved tail in lm-eval, refused in H2O", "[tasks][cnndm]") {
  const auto rows = read_jsonl(test::data("cnndm/cnndm_0shot.jsonl"));
  const auto zero_shot = make_task("cnndm")->generation_docs(cnndm_options(Pipeline::LmEval));
  const auto docs = make_task("cnndm")->generation_docs(cnndm_options(Pipeline::LmEval, 2, 3));
  REQUIRE(docs.size() == 3);
  // random.Random(42).sample(range(100), 2) == [81, 14]: documents 981 and 914.
  std::string examples;
  for (size_t pick : {981, 914})
    examples += zero_shot[pick].prompt + zero_shot[pick].reference + "\n\n";
  for (size_t i = 0; i < docs.size(); ++i) CHECK(docs[i].prompt == examples + zero_shot[i].prompt);
  CHECK(make_task("cnndm")->generation_docs(cnndm_options(Pipeline::LmEval, 5)).size() == 900);

  const std::string message =
      error_of([] { make_task("cnndm")->generation_docs(cnndm_options(Pipeline::H2O, 1)); });
  CHECK_THAT(message, Catch::Contains("0-shot"));
  CHECK_THAT(message, Catch::Contains("cnndm_0shot.jsonl"));
}

TEST_CASE("CNN/DM runs end to end in both pipelines", "[tasks][cnndm][eval]") {
  auto run = [](Pipeline pipeline, uint64_t seed, const std::string& policy) {
    EvalConfig config;
    config.task = "cnndm";
    config.task_options = cnndm_options(pipeline, 0, 3);
    config.policy = policy;
    if (policy != "full") config.policy_options.budget.ratio = 0.2;
    config.sample_seed = seed;
    return evaluate(test::stories(), config);
  };
  for (Pipeline pipeline : {Pipeline::LmEval, Pipeline::H2O}) {
    INFO((pipeline == Pipeline::H2O ? "h2o" : "lm-eval") << " pipeline");
    const EvalResult result = run(pipeline, 0, "h2o");
    CHECK(result.n == 3);
    // ROUGE-1/2/L, then the diversity metrics every generation task reports.
    REQUIRE(result.metrics.size() == 7);
    CHECK(result.metrics[0].name == "rouge1");
    CHECK(result.metrics[2].name == "rougeL");
    CHECK(result.metrics[3].name == "distinct1");
    CHECK(result.metrics[6].name == "repetition");
    CHECK(result.metrics[0].value > 0);  // stories260K's words overlap the highlights a little
    for (const auto& m : result.metrics) CHECK((m.value >= 0 && m.value <= 100));
    REQUIRE(result.agreement_with_full.has_value());
    for (const auto& doc : result.docs) CHECK_FALSE(doc.generated.empty());
  }
  // The H2O file's temperature 0.3 samples: another seed changes the text. The lm-eval
  // pipeline decodes greedily (the run's temperature 0): the seed changes nothing.
  auto texts = [](const EvalResult& r) {
    std::vector<std::string> out;
    for (const auto& doc : r.docs) out.push_back(doc.generated);
    return out;
  };
  CHECK(texts(run(Pipeline::H2O, 0, "full")) != texts(run(Pipeline::H2O, 1, "full")));
  CHECK(texts(run(Pipeline::LmEval, 0, "full")) == texts(run(Pipeline::LmEval, 1, "full")));
}

TEST_CASE("mathqa and cnndm in a sweep", "[sweep][mathqa][cnndm]") {
  const auto config = nlohmann::json::parse(R"({
    "tasks": ["mathqa", "cnndm"],
    "policies": ["full", "h2o", "h2o-paper"],
    "budgets": [0.2],
    "limit": {"cnndm": 2, "*": 10}
  })");
  const SweepPlan plan = expand_sweep(config, "sweep.json", test::data(""));
  // mathqa: full, h2o, h2o-paper; cnndm: full and h2o (h2o-paper cannot generate).
  REQUIRE(plan.cells.size() == 5);
  CHECK(plan.cells[0].eval.task == "mathqa");
  CHECK(plan.cells[0].eval.task_options.limit == 10);
  CHECK(plan.cells[3].eval.task == "cnndm");
  CHECK(plan.cells[3].eval.task_options.limit == 2);
  CHECK(plan.skipped == std::vector<std::string>{"h2o-paper x cnndm: a sim-only policy cannot generate"});
}
