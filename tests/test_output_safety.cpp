// Results files that cannot lose or double a row: the output-folder lock (two writers,
// --wait), duplicate grid cells, and a mid-file corruption that resume must not "repair".
#include <algorithm>
#include "tests/catch.h"
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "harness/common/errors.h"
#include "harness/common/folder_lock.h"
#include "harness/common/output_paths.h"
#include "notebooks-export/results_csv.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace kvevict;

namespace {

const char* kTinySweep = R"({"tasks": ["copa"], "policies": ["full", "h2o"], "budgets": [0.5], "limit": 3,
                             "max_length": 128})";

std::string write_config(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/sweep.json";
  std::ofstream(path) << text;
  return path;
}

// Cell keys with their metric, once per row: a doubled row shows as a repeated entry.
std::vector<std::string> row_keys(const std::string& out) {
  std::vector<std::string> keys;
  for (const auto& row : read_results_csv(out + "/results.csv")) {
    auto fields = row.fields();
    keys.push_back(fields["task"] + "|" + fields["policy"] + "|" + fields["budget"] + "|" + row.metric);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Starts `kvevict ARGS` in the background; its stderr goes to err, its exit code to rc.
void start(const std::string& args, const std::string& err, const std::string& rc) {
  const std::string command = "(" + test::kvevict_binary() + " " + args + " >/dev/null 2>" + err + "; echo $? >" + rc +
                              ") &";
  REQUIRE(std::system(command.c_str()) == 0);
}

std::string wait_for_file(const std::string& path) {
  for (int i = 0; i < 6000 && !(fs::exists(path) && fs::file_size(path) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return test::read_text(path);
}

}  // namespace

TEST_CASE("a folder another process writes to is refused, or waited for with --wait", "[sweep][lock]") {
  const std::string dir = test::temp_dir("lock_refuse");
  const std::string config = write_config(dir, kTinySweep);
  const std::string out = dir + "/out";
  fs::create_directories(out);
  {
    FolderLock held(out, false);  // this test process plays the other writer
    auto refused = test::run_kvevict("sweep " + config + " --out " + out);
    CHECK(refused.exit_code == 1);
    CHECK_THAT(refused.err, Catch::Contains(out) && Catch::Contains("another kvevict process") &&
                                Catch::Contains("--wait"));
    CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(out + "/results.csv"));

    // --wait: the sweep says it waits, and runs once the lock is free.
    start("sweep " + config + " --out " + out + " --wait", dir + "/err", dir + "/rc");
    for (int i = 0; i < 6000 && test::read_text(dir + "/err").find("waiting") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_THAT(test::read_text(dir + "/err"), Catch::Contains("waiting for another kvevict process"));
    CHECK_FALSE(fs::exists(out + "/results.csv"));  // nothing written while it waits
  }
  CHECK(wait_for_file(dir + "/rc") == "0\n");
  const auto keys = row_keys(out);
  CHECK(keys.size() == 2);  // copa acc for full and h2o
  CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == keys.size());

  // merge locks its --out the same way.
  fs::create_directories(dir + "/merged");
  FolderLock held(dir + "/merged", false);
  auto merge_refused = test::run_kvevict("merge " + out + " --out " + dir + "/merged");
  CHECK(merge_refused.exit_code == 1);
  CHECK_THAT(merge_refused.err, Catch::Contains("another kvevict process"));
  CHECK_FALSE(fs::exists(dir + "/merged/results.csv"));
}

TEST_CASE("two sweeps started at once on one --out leave each row exactly once", "[sweep][lock]") {
  const std::string dir = test::temp_dir("lock_race");
  const std::string config = write_config(dir, kTinySweep);
  for (const std::string wait : {"", " --wait"}) {
    INFO("flags:" << wait);
    const std::string out = dir + "/out" + std::to_string(wait.size());
    fs::remove(dir + "/rc1");
    fs::remove(dir + "/rc2");
    start("sweep " + config + " --out " + out + wait, dir + "/err1", dir + "/rc1");
    start("sweep " + config + " --out " + out + wait, dir + "/err2", dir + "/rc2");
    const std::string rc1 = wait_for_file(dir + "/rc1"), rc2 = wait_for_file(dir + "/rc2");
    const std::string err1 = test::read_text(dir + "/err1"), err2 = test::read_text(dir + "/err2");
    INFO("first: " << rc1 << err1 << "second: " << rc2 << err2);
    CHECK((rc1 == "0\n" || rc2 == "0\n"));
    if (!wait.empty()) CHECK((rc1 == "0\n" && rc2 == "0\n"));
    for (const auto& [rc, err] : {std::make_pair(rc1, err1), std::make_pair(rc2, err2)})
      if (rc != "0\n") CHECK_THAT(err, Catch::Contains("another kvevict process"));
    const auto keys = row_keys(out);
    CHECK(keys.size() == 2);
    CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == keys.size());
  }
}

TEST_CASE("a grid listing a cell twice runs it once, with a note", "[sweep]") {
  const std::string dir = test::temp_dir("duplicate_cells");
  const std::string config = write_config(
      dir, R"({"tasks": ["copa"], "policies": ["full", "h2o", "full"], "budgets": [0.5, 0.5], "limit": 3, "max_length": 128})");
  auto run = test::run_kvevict("sweep " + config + " --out " + dir + "/out");
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.err, Catch::Contains("duplicate cell task=copa policy=h2o budget=0.5"));
  CHECK_THAT(run.err, Catch::Contains("sweep 2 cells"));
  CHECK(row_keys(dir + "/out").size() == 2);
}

TEST_CASE("resume refuses a results.csv corrupted mid-file instead of truncating it", "[sweep]") {
  const std::string dir = test::temp_dir("resume_corrupt");
  const std::string config = write_config(dir, kTinySweep);
  const std::string out = dir + "/out";
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + out).exit_code == 0);
  std::string text = test::read_text(out + "/results.csv");
  const size_t second_row = text.find('\n') + 1;
  text.insert(second_row, "\"");  // one stray quote at the start of row 2
  std::ofstream(out + "/results.csv", std::ios::binary) << text;
  auto resumed = test::run_kvevict("sweep " + config + " --out " + out);
  CHECK(resumed.exit_code == 1);
  CHECK_THAT(resumed.err, Catch::Contains(out + "/results.csv:2:"));
  CHECK(test::read_text(out + "/results.csv") == text);  // nothing cut, nothing appended
}

TEST_CASE("eval progress in a log file is plain lines, no carriage returns", "[eval][logs]") {
  // run_kvevict's stderr is a file, as under Slurm or `2> log`: no live \r updates there.
  const auto result = test::run_kvevict("eval --task copa --limit 3 --max-length 128");
  REQUIRE(result.exit_code == 0);
  CHECK(result.err.find('\r') == std::string::npos);
  CHECK_THAT(result.err, Catch::Contains("examples 3/3\n"));
}

TEST_CASE("output paths: a sweep folder's own files and folders are refused, others allowed", "[output-paths]") {
  const std::string dir = test::temp_dir("output_paths");
  fs::create_directories(dir + "/R/slurm/x");
  std::ofstream(dir + "/R/results.csv") << "x";
  std::ofstream(dir + "/R/slurm/sweep.json") << "{}";
  fs::create_directories(dir + "/plain");
  std::ofstream(dir + "/plain/results.csv.txt") << "x";
  auto refusal = [](const std::function<void()>& action) -> std::string {
    try {
      action();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  for (const char* protected_name : {"results.csv", "config.json", ".kvevict.lock", "slurm/a.ipynb", "slurm/x/t.md",
                                     "shards/0/p.jsonl", "predictions/p.jsonl", "./results.csv", "slurm/../results.csv"})
    CHECK_THAT(refusal([&] { check_output_file(dir + "/R/" + protected_name, "--out"); }), Catch::Contains("--out"));
  CHECK_THAT(refusal([&] { check_output_folder(dir + "/R/slurm", "--svg"); }), Catch::Contains("slurm/"));
  CHECK_THAT(refusal([&] { check_output_folder(dir + "/R/results.csv", "--svg"); }), Catch::Contains("own results.csv"));
  CHECK_THAT(refusal([&] { check_output_file(dir + "/R", "--out"); }), Catch::Contains("is a folder"));
  CHECK_THAT(refusal([&] { check_output_file(dir + "/none/x.md", "--out"); }), Catch::Contains("does not exist"));
  // A folder that is no sweep's may hold a results.csv of anyone's; a sweep folder's table is fine.
  CHECK(refusal([&] { check_output_file(dir + "/plain/results.csv", "--out"); }).empty());
  CHECK(refusal([&] { check_output_file(dir + "/R/table.md", "--out"); }).empty());
  CHECK(refusal([&] { check_output_folder(dir + "/R/svg/new", "--svg"); }).empty());
  CHECK(refusal([&] { check_output_folder(dir + "/R", "--svg"); }).empty());
}

TEST_CASE("output paths: a command's inputs are refused by inode, through links and hard links", "[output-paths]") {
  const std::string dir = test::temp_dir("output_inputs");
  fs::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << "{}";
  std::ofstream(dir + "/text.txt") << "a text";
  fs::create_symlink(dir + "/text.txt", dir + "/link.txt");
  fs::create_hard_link(dir + "/text.txt", dir + "/hard.txt");
  fs::create_symlink(dir + "/model", dir + "/model_link");
  CommandInputs inputs;
  inputs.folder(dir + "/model", "--model").file(dir + "/text.txt", "--text-file");
  auto refusal = [&](const std::string& path) -> std::string {
    try {
      check_output_file(path, "--predictions", inputs);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(refusal(dir + "/text.txt"), Catch::Contains("--predictions") && Catch::Contains("is --text-file"));
  CHECK_THAT(refusal(dir + "/link.txt"), Catch::Contains("is --text-file"));
  CHECK_THAT(refusal(dir + "/hard.txt"), Catch::Contains("is --text-file"));
  CHECK_THAT(refusal(dir + "/model/config.json"), Catch::Contains("config.json"));
  CHECK_THAT(refusal(dir + "/model/new.json"), Catch::Contains("lies in --model"));
  CHECK_THAT(refusal(dir + "/model_link/new.json"), Catch::Contains("lies in --model"));
  CHECK(refusal(dir + "/elsewhere.jsonl").empty());
  // A folder output: the input folder itself, one inside it, and a named file that is an input.
  CHECK_THAT(test::error_of([&] { check_output_folder(dir + "/model", "--out", inputs); }), Catch::Contains("--model"));
  CHECK_THAT(test::error_of([&] { check_output_folder(dir + "/model/sub", "--out", inputs); }), Catch::Contains("lies in --model"));
  CHECK_THAT(test::error_of([&] { check_output_folder(dir, "--out", inputs, {"text.txt"}); }), Catch::Contains("is --text-file"));
  CHECK(test::error_of([&] { check_output_folder(dir + "/out", "--out", inputs, {"text.txt"}); }).empty());
  CHECK_THAT(test::error_of([&] { check_sweep_output_folder(dir + "/model", "--out", inputs); }), Catch::Contains("--model"));
}
