// `kvevict export --format kvpress-leaderboard`: the writer against a hand-made run, the
// files read back, and a real sweep's RULER cells exported and recomputed from their
// predictions.csv alone.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/common/files.h"
#include "harness/sweep/kvpress_leaderboard.h"
#include "tests/catch.h"
#include "tests/test_support.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

LeaderboardRun hand_made_run() {
  LeaderboardRun run;
  run.model = "stories260K-hf";
  run.press_name = "snapkv";
  run.compression_ratio = 0.75;
  run.query_aware = false;
  run.length = 4096;
  run.seed = 1;
  run.mode = "decode";
  run.protocol = "prefill-compress";
  run.version = "test";
  // niah_single_1: one of two found (50); vt: item 0 two of four found, item 1 all (75);
  // a control character inside the answer becomes a newline (RULER's postprocessing), so
  // "12\x01" + "34" does not contain "1234"; case does not matter; a comma, a quote and a
  // newline in the text survive the CSV.
  run.predictions = {
      {0, "niah_single_1", 4000, "What is the special magic number for x?\nAnswer:", {"1234"}, " The number is 12\x01" "34."},
      {1, "niah_single_1", 3990, "What is the special magic number for y?", {"777"}, "777, \"quoted\"\nnext line"},
      {0, "vt", 4010, "Question: Find all variables", {"AB", "cd", "EF", "gh"}, "ab, CD"},
      {1, "vt", 4011, "Question: Find all variables", {"X1", "Y2"}, "x1 y2"},
  };
  return run;
}

TEST_CASE("the kvpress leaderboard writer: metrics by hand, the folder's name, the files read back", "[export][leaderboard]") {
  const LeaderboardRun run = hand_made_run();
  const json metrics = leaderboard_metrics(run.predictions);
  CHECK(metrics["niah_single_1"]["string_match"].get<double>() == 50.0);
  CHECK(metrics["vt"]["string_match"].get<double>() == 75.0);
  CHECK(metrics["average"]["string_match"].get<double>() == 62.5);
  CHECK(metrics.size() == 3);
  CHECK(leaderboard_run_folder(run) == "ruler__4096__stories260K-hf__snapkv__0.75");
  LeaderboardRun aware = run;
  aware.query_aware = true;
  aware.press_name = "ada+snapkv";
  CHECK(leaderboard_run_folder(aware) == "ruler__4096__stories260K-hf__ada+snapkv__0.75__query_aware");

  const std::string dir = test::temp_dir("leaderboard_writer");
  const std::string folder = write_leaderboard_run(run, dir);
  CHECK(folder == dir + "/ruler__4096__stories260K-hf__snapkv__0.75");
  // The files, byte for byte, as written by hand.
  CHECK(test::read_text(folder + "/predictions.csv") ==
        "index,task,context_length,question,answer,predicted_answer\n"
        "0,niah_single_1,4000,\"What is the special magic number for x?\nAnswer:\",\"[\"\"1234\"\"]\", The number is 12\x01" "34.\n"
        "1,niah_single_1,3990,What is the special magic number for y?,\"[\"\"777\"\"]\",\"777, \"\"quoted\"\"\nnext line\"\n"
        "0,vt,4010,Question: Find all variables,\"[\"\"AB\"\",\"\"cd\"\",\"\"EF\"\",\"\"gh\"\"]\",\"ab, CD\"\n"
        "1,vt,4011,Question: Find all variables,\"[\"\"X1\"\",\"\"Y2\"\"]\",x1 y2\n");
  CHECK(test::read_text(folder + "/metrics.json") ==
        "{\n    \"average\": {\n        \"string_match\": 62.5\n    },\n"
        "    \"niah_single_1\": {\n        \"string_match\": 50.0\n    },\n"
        "    \"vt\": {\n        \"string_match\": 75.0\n    }\n}\n");
  // Read back: the same rows, and the metrics recompute from them exactly.
  const auto back = read_leaderboard_predictions(folder + "/predictions.csv");
  REQUIRE(back.size() == run.predictions.size());
  for (size_t i = 0; i < back.size(); ++i) {
    CHECK(back[i].index == run.predictions[i].index);
    CHECK(back[i].task == run.predictions[i].task);
    CHECK(back[i].context_length == run.predictions[i].context_length);
    CHECK(back[i].question == run.predictions[i].question);
    CHECK(back[i].answer == run.predictions[i].answer);
    CHECK(back[i].predicted_answer == run.predictions[i].predicted_answer);
  }
  CHECK(leaderboard_metrics(back) == read_json_file(folder + "/metrics.json"));
  const std::string yaml = test::read_text(folder + "/config.yaml");
  for (const char* line : {"dataset: ruler\n", "data_dir: '4096'\n", "model: stories260K-hf\n", "press_name: snapkv\n",
                           "compression_ratio: 0.75\n", "query_aware: false\n", "seed: 1\n", "harness: kvevict\n"})
    CHECK(yaml.find(line) != std::string::npos);

  // A malformed file is refused naming its line.
  std::ofstream(dir + "/bad.csv") << "index,task,context_length,question,answer,predicted_answer\n0,vt,12,q,[1],x\n";
  CHECK_THROWS_WITH(read_leaderboard_predictions(dir + "/bad.csv"), Catch::Contains("bad.csv:2") && Catch::Contains("answer"));
}

TEST_CASE("a sweep's RULER cells export as leaderboard runs whose metrics recompute from predictions.csv",
          "[export][leaderboard]") {
  const std::string dir = test::temp_dir("leaderboard_sweep");
  const json config = {{"models", {"models/stories260K-hf"}},
                       {"tasks", {"ruler_niah_single_1", "ruler_fwe", "niah"}},
                       {"policies", {"full", "snapkv"}},
                       {"budgets", {0.5}},
                       {"protocols", {"prefill-compress"}},
                       {"lengths", {500}},
                       {"depths", {0.5}},
                       {"questions", {"aware", "agnostic"}},
                       {"seeds", {1}},
                       {"limit", 2},
                       {"mode", "decode"},
                       {"max_length", 512},
                       {"predictions", true}};
  std::ofstream(dir + "/sweep.json") << config.dump(1);
  auto sweep = test::run_kvevict("sweep " + dir + "/sweep.json --out " + dir + "/run");
  INFO(sweep.err);
  REQUIRE(sweep.exit_code == 0);
  auto exported = test::run_kvevict("export " + dir + "/run --format kvpress-leaderboard");
  INFO(exported.err);
  REQUIRE(exported.exit_code == 0);
  CHECK(exported.err.find("left out (not a RULER task): task=niah") != std::string::npos);
  const std::string out = dir + "/run/kvpress-leaderboard";
  std::vector<std::string> folders;
  for (const auto& entry : fs::directory_iterator(out)) folders.push_back(entry.path().filename().string());
  std::sort(folders.begin(), folders.end());
  const std::vector<std::string> expected = {
      "ruler__500__stories260K-hf__full__0.00", "ruler__500__stories260K-hf__full__0.00__query_aware",
      "ruler__500__stories260K-hf__snapkv__0.50", "ruler__500__stories260K-hf__snapkv__0.50__query_aware"};
  CHECK(folders == expected);
  for (const auto& name : folders) {
    INFO(name);
    const auto predictions = read_leaderboard_predictions(out + "/" + name + "/predictions.csv");
    CHECK(predictions.size() == 4);  // two items of each of the two RULER tasks
    const json metrics = read_json_file(out + "/" + name + "/metrics.json");
    CHECK(metrics.contains("niah_single_1"));
    CHECK(metrics.contains("fwe"));
    CHECK(leaderboard_metrics(predictions) == metrics);
    for (const auto& p : predictions) {
      CHECK(p.context_length > 300);
      CHECK(p.context_length <= 500);
      CHECK(!p.question.empty());
      CHECK(!p.answer.empty());
    }
  }
  // The predictions are the sweep's own: each exported row is a line of a cell's file.
  const auto full = read_leaderboard_predictions(out + "/" + expected[1] + "/predictions.csv");
  bool found = false;
  for (const auto& entry : fs::directory_iterator(dir + "/run/predictions")) {
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      const json j = json::parse(line);
      for (const auto& p : full)
        found = found || (j["policy"] == "full" && j["task"] == "ruler_" + p.task && j["id"] == std::to_string(p.index) &&
                          j["question"] == p.question && j["prediction"] == p.predicted_answer);
    }
  }
  CHECK(found);
  // Without predictions kept, the export says what is missing.
  json bare = config;
  bare.erase("predictions");
  std::ofstream(dir + "/bare.json") << bare.dump(1);
  REQUIRE(test::run_kvevict("sweep " + dir + "/bare.json --out " + dir + "/bare").exit_code == 0);
  auto refused = test::run_kvevict("export " + dir + "/bare --format kvpress-leaderboard");
  CHECK(refused.exit_code == 1);
  CHECK(refused.err.find("\"predictions\": true") != std::string::npos);
}

}  // namespace
}  // namespace kvevict
