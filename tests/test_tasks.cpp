// Tasks: lm-evaluation-harness 0.3.0 requests from the real data files, few-shot
// sampling identical to CPython's random, XSum prompts identical to H2O/HELM's, metrics,
// and the errors bad data files produce.
//
// Expected prompts are written out by hand from PROTOCOLS.md §3-4 and the data files.
// Which documents come first and which few-shot examples they get was worked out with
// Python 3.11's random module, mirroring lm-eval 0.3's evaluator:
//   rnd = random.Random(42); rnd.shuffle(docs); then per document rnd.sample(train, k)
//   (or rnd.sample(eval_docs, k + 1) minus the document itself when there is no train split).
#include "tests/catch.h"
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "tasks/fewshot.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"
#include "tasks/task.h"
#include "tests/test_support.h"

using namespace kvevict;

using kvevict::test::error_of;

namespace {

TaskOptions real_data(int shots) {
  TaskOptions options;
  options.data_dir = test::data("");
  options.shots = shots;
  return options;
}

MultipleChoiceDoc first_doc(const std::string& task, int shots) {
  auto docs = make_task(task)->multiple_choice_docs(real_data(shots));
  REQUIRE_FALSE(docs.empty());
  return docs.front();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `fn` and returns the kvevict::Error message it throws ("" if none).
const char* kCopaLine =
    R"({"premise": "The man turned on the faucet.", "choice1": "The toilet filled with water.", )"
    R"("choice2": "Water flowed from the spout.", "question": "effect", "label": 1, "idx": 0})";

}  // namespace

// ---------------------------------------------------------------------------------------
// CPython random

TEST_CASE("PythonRandom reproduces CPython's random.Random", "[tasks][fewshot]") {
  // Every expected value below was printed by Python 3.11.7, e.g.
  //   python3 -c "import random; print(random.Random(42).sample(range(32), 5))"
  CHECK(PythonRandom(42).random() == 0.6394267984578837);
  // k <= 5 with n = 32 > 21: the set-based algorithm.
  CHECK(PythonRandom(42).sample(32, 5) == std::vector<size_t>{7, 1, 17, 15, 14});
  // k = 10: setsize = 21 + 4**ceil(log(30, 4)) = 85 >= 32: the pool-based algorithm.
  CHECK(PythonRandom(42).sample(32, 10) == std::vector<size_t>{7, 0, 23, 8, 31, 27, 4, 29, 3, 21});
  CHECK(PythonRandom(0).sample(1838, 3) == std::vector<size_t>{1729, 788, 1552});
  // A seed wider than 32 bits seeds init_by_array with two words.
  CHECK(PythonRandom(123456789012LL).sample(100, 4) == std::vector<size_t>{48, 83, 2, 33});
  // Python seeds with abs(seed).
  CHECK(PythonRandom(-42).sample(32, 5) == std::vector<size_t>{7, 1, 17, 15, 14});
  // A seed read as unsigned 64 bits (every seed kvevict reads) past 2^63 - 1 is that
  // number, not a negative one (python3 -c "import random; print(random.Random(2**64-1).random())").
  CHECK(PythonRandom::from_seed(18446744073709551615ULL).random() == 0.021825695401270107);
  CHECK(PythonRandom::from_seed(9223372036854775808ULL).random() == 0.5534639983914199);
  CHECK(PythonRandom::from_seed(42).sample(32, 5) == std::vector<size_t>{7, 1, 17, 15, 14});

  // r = random.Random(42); x = list(range(10)); r.shuffle(x)
  std::vector<int> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  PythonRandom shuffler(42);
  shuffler.shuffle(x);
  CHECK(x == std::vector<int>{7, 3, 2, 8, 5, 6, 9, 4, 0, 1});

  // One generator, several calls: the state advances from call to call, as lm-eval's
  // single per-task generator does from document to document.
  PythonRandom rnd(42);
  CHECK(rnd.sample(32, 2) == std::vector<size_t>{7, 1});
  CHECK(rnd.sample(32, 2) == std::vector<size_t>{17, 15});
  CHECK(rnd.sample(1000, 6) == std::vector<size_t>{228, 142, 754, 104, 692, 758});

  // r = random.Random(7); r.getrandbits(64), r.getrandbits(33), r.getrandbits(1)
  PythonRandom bits(7);
  CHECK(bits.getrandbits(64) == 17485029721327973432ULL);
  CHECK(bits.getrandbits(33) == 647892279ULL);
  CHECK(bits.getrandbits(1) == 1ULL);

  CHECK_THROWS_AS(PythonRandom(1).sample(3, 4), Error);
}

TEST_CASE("few-shot contexts are joined the lm-eval 0.3 way", "[tasks][fewshot]") {
  CHECK(fewshot_context({}, "Q") == "Q");
  CHECK(fewshot_context({"A1", "B2"}, "Q") == "A1\n\nB2\n\nQ");
  // Winogrande's append_context: the last "\n\n" piece (the doc's own text) is replaced.
  CHECK(append_partial_context("Only the doc", "partial") == "partial");
  CHECK(append_partial_context("ex1\n\nex2\n\ndoc", "partial") == "ex1\n\nex2\n\npartial");
  // Python's split scans left to right: "a\n\n\nb".split("\n\n") == ["a", "\nb"].
  CHECK(append_partial_context("a\n\n\nb", "p") == "a\n\np");
}

// ---------------------------------------------------------------------------------------
// Exact requests of each task's first document (default options: lm-eval's shuffle).

TEST_CASE("COPA requests match lm-eval 0.3", "[tasks][copa]") {
  // random.Random(42).shuffle(range(100)) puts val doc idx 42 first; its 2-shot examples
  // come from the full train split: rnd.sample(range(400), 2) == [108, 290] after the
  // shuffle -> train.jsonl idx 108 and 290 (checked with Python 3's random module). With
  // the 32-example split they were train32.jsonl lines 14 and 21.
  const std::string query = "The pair of students came under scrutiny by the teacher because";
  const std::string choice1 = " the students both received excellent grades.";
  const std::string choice2 = " their responses on the assignment were identical.";

  const auto zero = first_doc("copa", 0);
  CHECK(zero.id == "42");
  CHECK(zero.gold == 1);
  REQUIRE(zero.requests.size() == 2);
  CHECK(zero.requests[0].context == query);
  CHECK(zero.requests[0].continuation == choice1);
  CHECK(zero.requests[1].context == query);
  CHECK(zero.requests[1].continuation == choice2);
  CHECK(zero.choice_texts ==
        std::vector<std::string>{"the students both received excellent grades.",
                                 "their responses on the assignment were identical."});

  const auto two = first_doc("copa", 2);
  const std::string context =
      "The bartender refused to serve the patron because the patron was drunk.\n\n"
      "The girl politely declined the hamburger because she was a vegetarian.\n\n" +
      query;
  CHECK(two.id == "42");
  REQUIRE(two.requests.size() == 2);
  CHECK(two.requests[0].context == context);
  CHECK(two.requests[0].continuation == choice1);
  CHECK(two.requests[1].context == context);
  CHECK(two.requests[1].continuation == choice2);
}

TEST_CASE("COPA in file order starts with the file's first line", "[tasks][copa]") {
  auto options = real_data(0);
  options.lm_eval_shuffle = false;
  const auto docs = make_task("copa")->multiple_choice_docs(options);
  REQUIRE(docs.size() == 100);
  CHECK(docs[0].id == "0");
  CHECK(docs[0].requests[0].context == "The man turned on the faucet therefore");
  CHECK(docs[0].requests[0].continuation == " the toilet filled with water.");
  CHECK(docs[0].requests[1].continuation == " water flowed from the spout.");
  CHECK(docs[0].gold == 1);
}

TEST_CASE("PIQA requests match lm-eval 0.3", "[tasks][piqa]") {
  // First after the shuffle: valid.jsonl line 718 (label 0). 2-shot examples come from the
  // train split: rnd.sample(range(16113), 2) == [12327, 12264] -> train.jsonl lines 12328
  // and 12265 with their train-labels.lst answers (checked with Python 3's random module).
  // Drawn from the validation split, as before the train split was shipped, they were
  // valid.jsonl lines 1541 and 1534.
  const std::string query = "Question: Remove seeds from  strawberries\nAnswer:";
  const std::string sol1 =
      "Blend the strawberries, pour the mixture through a fine-mesh strainer with a bowl "
      "underneath to catch the pulps and strain out the seeds";
  const std::string sol2 =
      "Chop up the strawberries, pour the mixture through a fine-mesh strainer with a bowl "
      "underneath to catch the pulps and strain out the seeds";

  const auto zero = first_doc("piqa", 0);
  CHECK(zero.id == "717");
  CHECK(zero.gold == 0);
  REQUIRE(zero.requests.size() == 2);
  CHECK(zero.requests[0].context == query);
  CHECK(zero.requests[0].continuation == " " + sol1);
  CHECK(zero.requests[1].context == query);
  CHECK(zero.requests[1].continuation == " " + sol2);
  CHECK(zero.choice_texts == std::vector<std::string>{sol1, sol2});

  const auto two = first_doc("piqa", 2);
  const std::string context =
      "Question: To start a hole of golf,\nAnswer: drive your ball onto the field from the tee.\n\n"
      "Question: How do you remove the motherboard from a computer case.\nAnswer: After removing "
      "every other component (or you can leave the CPU, CPU fan and RAM), unscrew the screw "
      "holding the motherboard on the standoffs, and then unscrew the standoffs from the case.\n\n" +
      query;
  REQUIRE(two.requests.size() == 2);
  CHECK(two.requests[0].context == context);
  CHECK(two.requests[0].continuation == " " + sol1);
  CHECK(two.requests[1].context == context);
  CHECK(two.requests[1].continuation == " " + sol2);
}

TEST_CASE("Winogrande requests use lm-eval 0.3's partial evaluation", "[tasks][winogrande]") {
  // First after the shuffle: dev.jsonl line 188 (answer "2"). 2-shot examples come from
  // winogrande_xl train: rnd.sample(range(40398), 2) == [5906, 19340] -> train_xl_noqid.jsonl
  // lines 5907 and 19341, each filled with its correct option (checked with Python 3's
  // random module). Drawn from dev, as before, they were dev.jsonl lines 185 and 605.
  const std::string continuation =
      " is embarassed, because Samantha made snide comments about the shirt Rebecca was wearing.";

  const auto zero = first_doc("winogrande", 0);
  CHECK(zero.id == "3909MD9T2ZFW5ZXLUJTM63XLNVRFE8-2");
  CHECK(zero.gold == 1);
  REQUIRE(zero.requests.size() == 2);
  CHECK(zero.requests[0].context == "People think Samantha");
  CHECK(zero.requests[0].continuation == continuation);
  CHECK(zero.requests[1].context == "People think Rebecca");
  CHECK(zero.requests[1].continuation == continuation);

  const auto two = first_doc("winogrande", 2);
  const std::string examples =
      "Natalie took basic French lessons from Betty after school because Betty is strong at that "
      "language.\n\n"
      "My friends tried to drive the car through the alleyway but the car was too wide.\n\n";
  REQUIRE(two.requests.size() == 2);
  CHECK(two.requests[0].context == examples + "People think Samantha");
  CHECK(two.requests[0].continuation == continuation);
  CHECK(two.requests[1].context == examples + "People think Rebecca");
  CHECK(two.requests[1].continuation == continuation);
}

TEST_CASE("OpenBookQA requests match lm-eval 0.3", "[tasks][openbookqa]") {
  // First after the shuffle: test.jsonl line 165 (answerKey A). 2-shot examples come from
  // train.tsv: rnd.sample(range(4957), 2) == [313, 888] -> data rows 314 and 889.
  const std::string query = "Atomic 26 is drawn to a device, it could be";
  const std::vector<std::string> choices = {"magnetized", "Na", "compass", "K"};

  const auto zero = first_doc("openbookqa", 0);
  CHECK(zero.id == "7-1132");
  CHECK(zero.gold == 0);
  REQUIRE(zero.requests.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(zero.requests[i].context == query);
    CHECK(zero.requests[i].continuation == " " + choices[i]);
  }
  CHECK(zero.choice_texts == choices);

  const auto two = first_doc("openbookqa", 2);
  const std::string context =
      "If an animal is able to reproduce then that animal has matured\n\n"
      "running turns carbohydrates into motion and heat\n\n" +
      query;
  REQUIRE(two.requests.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(two.requests[i].context == context);
    CHECK(two.requests[i].continuation == " " + choices[i]);
  }
}

TEST_CASE("RTE requests match lm-eval 0.3", "[tasks][rte]") {
  // First after the shuffle: val.jsonl line 190 (entailment). 2-shot examples come from the
  // full train split: rnd.sample(range(2490), 2) == [207, 2214] -> train.jsonl idx 207
  // (not_entailment) and 2214 (entailment) (checked with Python 3's random module). From
  // train32.jsonl, as before, they were its lines 4 and 1.
  const std::string query =
      "The number of Danes opposed to swapping the krone for the euro has increased slightly to "
      "35.3 percent, up from 34.6 percent in April, according to a poll published on Thursday by "
      "Danske Bank.\nQuestion: The introduction of the euro has been opposed. True or "
      "False?\nAnswer:";

  const auto zero = first_doc("rte", 0);
  CHECK(zero.id == "189");
  CHECK(zero.gold == 0);
  REQUIRE(zero.requests.size() == 2);
  CHECK(zero.requests[0].context == query);
  CHECK(zero.requests[0].continuation == " True");
  CHECK(zero.requests[1].context == query);
  CHECK(zero.requests[1].continuation == " False");

  const auto two = first_doc("rte", 2);
  const std::string context =
      "McDonald's said overall global sales at its restaurants climbed 6.2% in June, 6.3% in the "
      "second quarter and 7.1% for the year to date.\nQuestion: McDonald's Corp., the world's largest "
      "restaurant chain, led the advance after the company reported earnings that exceeded "
      "estimates. True or False?\nAnswer: False\n\n"
      "The son of Italy's last king returned to his homeland Monday, ending more than a half-century "
      "of exile. Victor Emmanuel and his family landed at a military airport in Rome in a private "
      "plane and headed immediately for an audience with Pope John Paul II.\nQuestion: Italian "
      "royal family returns home. True or False?\nAnswer: True\n\n" +
      query;
  REQUIRE(two.requests.size() == 2);
  CHECK(two.requests[0].context == context);
  CHECK(two.requests[0].continuation == " True");
  CHECK(two.requests[1].context == context);
  CHECK(two.requests[1].continuation == " False");
}

TEST_CASE("every multiple-choice split loads completely", "[tasks]") {
  const std::vector<std::pair<std::string, size_t>> sizes = {
      {"copa", 100}, {"piqa", 1838}, {"winogrande", 1267}, {"openbookqa", 500}, {"rte", 277}};
  for (const auto& [task, size] : sizes) {
    INFO(task);
    const auto docs = make_task(task)->multiple_choice_docs(real_data(5));
    CHECK(docs.size() == size);
    auto limited = real_data(5);
    limited.limit = 7;
    const auto first = make_task(task)->multiple_choice_docs(limited);
    REQUIRE(first.size() == 7);
    // `limit` keeps a prefix of the evaluation order; draws for earlier docs are unchanged.
    for (size_t i = 0; i < 7; ++i)
      CHECK(first[i].requests[0].context == docs[i].requests[0].context);
  }
}

// ---------------------------------------------------------------------------------------
// XSum

namespace {
std::string xsum_block(const std::string& article) {
  return "###\nArticle: " + article + "\n\nSummarize the above article in 1 sentence.\n";
}
}  // namespace

TEST_CASE("XSum 0-shot prompts equal H2O's xsum_0shot.jsonl (HELM's prompt)", "[tasks][xsum]") {
  const auto docs = make_task("xsum")->generation_docs(real_data(0));
  REQUIRE(docs.size() == 1000);
  const auto helm = read_jsonl(test::data("xsum/xsum_0shot.jsonl"));
  REQUIRE(helm.size() == 1000);
  for (size_t i = 0; i < docs.size(); ++i) {
    INFO("document " << i);
    REQUIRE(docs[i].prompt == helm[i].string_field("article"));
    REQUIRE(docs[i].reference == helm[i].string_field("summary_gt"));
  }
  CHECK(docs[0].id == "0");
  CHECK(docs[0].stop == std::vector<std::string>{"###"});
  CHECK(docs[0].max_new_tokens == 64);
  CHECK(docs[0].prompt.rfind("###\nArticle: Prison Link Cymru had 1,099 referrals in 2015-16", 0) ==
        0);
}

TEST_CASE("XSum few-shot examples come from the reserved tail", "[tasks][xsum]") {
  const auto source = read_jsonl(test::data("xsum/xsum_test_1000.jsonl"));
  auto options = real_data(2);
  options.limit = 3;
  const auto docs = make_task("xsum")->generation_docs(options);
  REQUIRE(docs.size() == 3);
  // random.Random(42).sample(range(100), 2) == [81, 14]: documents 981 and 914.
  std::string examples;
  for (size_t pick : {981, 914})
    examples += xsum_block(source[pick].string_field("document")) +
                source[pick].string_field("summary") + "\n\n";
  for (size_t i = 0; i < docs.size(); ++i)
    CHECK(docs[i].prompt == examples + xsum_block(source[i].string_field("document")));

  // Without a limit, few-shot runs evaluate only the 900 documents outside the pool.
  CHECK(make_task("xsum")->generation_docs(real_data(5)).size() == 900);
}

TEST_CASE("XSum can apply HELM's 512-word article cleaning", "[tasks][xsum]") {
  auto options = real_data(0);
  options.xsum_helm_truncate = true;
  options.limit = 1;
  const auto docs = make_task("xsum")->generation_docs(options);
  REQUIRE(docs.size() == 1);
  // Document 0 has 599 whitespace-separated words; HELM keeps the first 512.
  const std::string& prompt = docs[0].prompt;
  const std::string head = "###\nArticle: ",
                    tail = "\n\nSummarize the above article in 1 sentence.\n";
  REQUIRE(prompt.size() > head.size() + tail.size());
  const std::string article = prompt.substr(head.size(), prompt.size() - head.size() - tail.size());
  size_t words = 1;
  for (char c : article) words += c == ' ';
  CHECK(words == 512);
  CHECK(article.find("  ") == std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Metrics

TEST_CASE("choice predictions and lm-eval aggregation", "[tasks][metrics]") {
  MultipleChoiceDoc doc;
  doc.id = "hand";
  doc.requests = {{"c", " ab"}, {"c", " abcdef"}};
  doc.choice_texts = {"ab", "abcdef"};  // 2 and 6 characters
  doc.gold = 1;
  // Sum: -4 vs -6 -> choice 0; normalised -2 vs -1 -> choice 1.
  // Mean: -4/2 = -2 vs -6/2 = -3 -> choice 0; normalised -1 vs -0.5 -> choice 1.
  const std::vector<LoglikelihoodResult> results = {{-4.0, 2, false}, {-6.0, 2, false}};
  const auto sum = predict_choice(doc, results, ScoreMode::Sum);
  CHECK(sum.predicted == 0);
  CHECK(sum.predicted_norm == 1);
  CHECK(sum.chosen_loglikelihood == -4.0);
  const auto mean = predict_choice(doc, results, ScoreMode::Mean);
  CHECK(mean.predicted == 0);
  CHECK(mean.predicted_norm == 1);
  CHECK(mean.chosen_loglikelihood == -2.0);

  // Ties go to the first choice, as np.argmax.
  CHECK(predict_choice(doc, {{-1.0, 1, false}, {-1.0, 1, false}}, ScoreMode::Sum).predicted == 0);
  // Lengths count characters as Python's len() does: "\u00e9" is 1 character (2 bytes), so
  // -3/1 = -3 loses to -4/2 = -2 (counting bytes, -3/2 = -1.5 would win).
  MultipleChoiceDoc accented = doc;
  accented.choice_texts = {"\u00e9", "ab"};
  CHECK(predict_choice(accented, {{-3.0, 1, false}, {-4.0, 1, false}}, ScoreMode::Sum)
            .predicted_norm == 1);

  CHECK_THROWS_AS(predict_choice(doc, {{-1.0, 1, false}}, ScoreMode::Sum), Error);
  CHECK_THROWS_AS(predict_choice(doc, {{-1.0, 0, false}, {-1.0, 1, false}}, ScoreMode::Mean),
                  Error);

  // acc over [1, 0, 1, 1]: mean 0.75; deviations 0.25, 0.75, 0.25, 0.25 -> squares sum 0.75;
  // / (n - 1) = 0.25; sqrt = 0.5; / sqrt(4) = 0.25.
  const auto m = mean_metric("acc", {1, 0, 1, 1});
  CHECK(m.name == "acc");
  CHECK(m.n == 4);
  CHECK(m.value == Approx(0.75));
  CHECK(m.stderr_ == Approx(0.25));
  CHECK(mean_metric("acc", {1}).stderr_ == 0);

  std::vector<MultipleChoiceDoc> docs(4, doc);  // gold 1 everywhere
  std::vector<ChoicePrediction> predictions(4);
  predictions[0].predicted = 1, predictions[0].predicted_norm = 1;
  predictions[1].predicted = 0, predictions[1].predicted_norm = 1;
  predictions[2].predicted = 1, predictions[2].predicted_norm = 0;
  predictions[3].predicted = 1, predictions[3].predicted_norm = 0;
  const auto metrics = multiple_choice_metrics(docs, predictions, {"acc", "acc_norm"});
  REQUIRE(metrics.size() == 2);
  CHECK(metrics[0].name == "acc");
  CHECK(metrics[0].value == Approx(0.75));
  CHECK(metrics[0].stderr_ == Approx(0.25));
  CHECK(metrics[1].name == "acc_norm");
  CHECK(metrics[1].value == Approx(0.5));
  // deviations all 0.5 -> squares 1.0; /3; sqrt = 0.57735; /2 = 0.288675.
  CHECK(metrics[1].stderr_ == Approx(std::sqrt(1.0 / 3.0) / 2.0));
}

TEST_CASE("agreement between a policy run and the full-cache run", "[tasks][metrics]") {
  CHECK(prediction_agreement({0, 1, 1, 2}, {0, 1, 0, 2}) == Approx(0.75));
  CHECK_THROWS_AS(prediction_agreement({0}, {0, 1}), Error);
  std::vector<ChoicePrediction> policy(2), full(2);
  policy[0].chosen_loglikelihood = -1.0, full[0].chosen_loglikelihood = -1.5;
  policy[1].chosen_loglikelihood = -3.0, full[1].chosen_loglikelihood = -2.0;
  CHECK(mean_abs_loglikelihood_change(policy, full) == Approx(0.75));  // (0.5 + 1.0) / 2
}

// ---------------------------------------------------------------------------------------
// Registry and bad input

TEST_CASE("task registry", "[tasks]") {
  CHECK(task_names() == std::vector<std::string>{"copa", "piqa", "winogrande", "openbookqa", "rte",
                                                 "mathqa", "mathqa_cot", "xsum", "cnndm", "perplexity",
                                                 "ruler_niah_single_1", "ruler_niah_single_2", "ruler_niah_single_3",
                                                 "ruler_niah_multikey_1", "ruler_niah_multikey_2",
                                                 "ruler_niah_multikey_3", "ruler_niah_multivalue",
                                                 "ruler_niah_multiquery", "ruler_vt", "ruler_cwe", "ruler_fwe", "niah"});
  CHECK(make_task("xsum")->kind() == TaskKind::Generation);
  CHECK(make_task("piqa")->metric_names() == std::vector<std::string>{"acc", "acc_norm"});
  CHECK(make_task("copa")->metric_names() == std::vector<std::string>{"acc"});
  const auto perplexity = make_task("perplexity");
  CHECK(perplexity->kind() == TaskKind::Perplexity);
  CHECK(perplexity->metric_names() == std::vector<std::string>{"mean_nll", "ppl"});

  const std::string message = error_of([] { make_task("hellaswag"); });
  CHECK(message.find("hellaswag") != std::string::npos);
  CHECK(message.find("copa, piqa, winogrande, openbookqa, rte, mathqa, mathqa_cot, xsum, cnndm, perplexity") !=
        std::string::npos);
}

TEST_CASE("bad data files give errors naming the file and line", "[tasks][errors]") {
  const std::string dir = test::temp_dir("tasks_bad_input");
  for (const char* sub : {"copa", "rte", "piqa", "winogrande", "openbookqa", "xsum"})
    std::filesystem::create_directories(dir + "/" + sub);
  TaskOptions options;
  options.data_dir = dir;

  SECTION("malformed JSONL line") {
    write_file(dir + "/copa/val.jsonl", std::string(kCopaLine) + "\n\n{\"premise\": \"broken\n");
    const std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/copa/val.jsonl:3") != std::string::npos);
    CHECK(message.find("malformed JSON") != std::string::npos);
  }
  SECTION("a number too large for a double (found by the task_jsonl fuzzer: was an uncaught out_of_range)") {
    write_file(dir + "/copa/val.jsonl", std::string(kCopaLine) + "\n1111111e01110\n");
    const std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/copa/val.jsonl:2") != std::string::npos);
    CHECK(message.find("malformed JSON") != std::string::npos);
  }
  SECTION("COPA label out of range") {
    std::string line = kCopaLine;
    line.replace(line.find("\"label\": 1"), 10, "\"label\": 2");
    write_file(dir + "/copa/val.jsonl", std::string(kCopaLine) + "\n" + line + "\n");
    const std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/copa/val.jsonl:2") != std::string::npos);
    CHECK(message.find("label 2 out of range") != std::string::npos);
  }
  SECTION("a missing field") {
    write_file(dir + "/copa/val.jsonl",
               R"({"premise": "P.", "choice1": "A.", "question": "cause", "label": 0, "idx": 0})");
    const std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find("val.jsonl:1") != std::string::npos);
    CHECK(message.find("choice2") != std::string::npos);
  }
  SECTION("RTE label out of range") {
    write_file(dir + "/rte/val.jsonl",
               R"({"premise": "P", "hypothesis": "H", "label": "neutral", "idx": 0})"
               "\n");
    const std::string message = error_of([&] { make_task("rte")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/rte/val.jsonl:1") != std::string::npos);
    CHECK(message.find("out of range") != std::string::npos);
  }
  SECTION("PIQA label out of range, and labels not matching documents") {
    write_file(dir + "/piqa/valid.jsonl",
               "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\"}\n"
               "{\"goal\": \"h\", \"sol1\": \"c\", \"sol2\": \"d\"}\n");
    write_file(dir + "/piqa/valid-labels.lst", "0\n2\n");
    std::string message = error_of([&] { make_task("piqa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/piqa/valid-labels.lst:2") != std::string::npos);
    CHECK(message.find("out of range") != std::string::npos);
    write_file(dir + "/piqa/valid-labels.lst", "0\n");
    message = error_of([&] { make_task("piqa")->multiple_choice_docs(options); });
    CHECK(message.find("valid-labels.lst") != std::string::npos);
    CHECK(message.find("1 labels for 2 documents") != std::string::npos);
  }
  SECTION("Winogrande answer out of range") {
    write_file(
        dir + "/winogrande/dev.jsonl",
        R"({"qID": "q", "sentence": "A _ b.", "option1": "x", "option2": "y", "answer": "3"})"
        "\n");
    const std::string message =
        error_of([&] { make_task("winogrande")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/winogrande/dev.jsonl:1") != std::string::npos);
    CHECK(message.find("out of range") != std::string::npos);
  }
  SECTION("OpenBookQA answer key out of range") {
    write_file(
        dir + "/openbookqa/test.jsonl",
        R"({"id": "1", "question": {"stem": "S", "choices": [{"text": "a", "label": "A"}, )"
        R"({"text": "b", "label": "B"}, {"text": "c", "label": "C"}, {"text": "d", "label": "D"}]}, "answerKey": "E"})"
        "\n");
    const std::string message =
        error_of([&] { make_task("openbookqa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/openbookqa/test.jsonl:1") != std::string::npos);
    CHECK(message.find("out of range") != std::string::npos);
  }
  SECTION("missing split files") {
    std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find("missing data file") != std::string::npos);
    CHECK(message.find(dir + "/copa/val.jsonl") != std::string::npos);

    // The training split is needed only for few-shot runs.
    write_file(dir + "/copa/val.jsonl", std::string(kCopaLine) + "\n");
    CHECK(make_task("copa")->multiple_choice_docs(options).size() == 1);
    options.shots = 2;
    message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find(dir + "/copa/train32.jsonl") != std::string::npos);

    message = error_of([&] { make_task("xsum")->generation_docs(options); });
    CHECK(message.find(dir + "/xsum/xsum_test_1000.jsonl") != std::string::npos);
  }
  SECTION("more shots than examples") {
    write_file(dir + "/copa/val.jsonl", std::string(kCopaLine) + "\n");
    write_file(dir + "/copa/train32.jsonl", std::string(kCopaLine) + "\n");
    options.shots = 2;
    const std::string message = error_of([&] { make_task("copa")->multiple_choice_docs(options); });
    CHECK(message.find("2 shots") != std::string::npos);
  }
}
