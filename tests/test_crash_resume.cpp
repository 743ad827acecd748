// kill -9 at 24 points of a sweep's writes (before, inside and after each cell's append,
// and inside the resume-time rewrite), then resume: results.csv must end equal to an
// uninterrupted run's. Likewise merge's and table's writes: killed anywhere, they leave
// whole files only, and the same command run again finishes the job. The kills are exact: KVEVICT_KILL_POINT (harness/common/kill_points.h)
// makes the process SIGKILL itself at the named point, so each case is reproducible.
#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include "tests/catch.h"
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "notebooks-export/results_csv.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace kvevict;

namespace {

// Six cells: three copa cells of one row (acc), then three perplexity cells of two
// (mean_nll, ppl), whose torn write leaves a cell half present.
const char* kSweep = R"({"tasks": ["copa", "perplexity"], "policies": ["full", "local", "h2o"],
                         "budgets": [0.5], "limit": 2, "max_length": 64})";

std::vector<std::string> comparable_rows(const std::string& out) {
  std::vector<std::string> rows = test::rows_without_timing(out);
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Runs `kvevict ARGS` with KVEVICT_KILL_POINT=point ("" for none); returns the exit code (-1: signal).
int run_killed(const std::string& args, const std::string& point) {
  if (point.empty())
    ::unsetenv("KVEVICT_KILL_POINT");
  else
    ::setenv("KVEVICT_KILL_POINT", point.c_str(), 1);
  const int code = test::run_kvevict(args).exit_code;
  ::unsetenv("KVEVICT_KILL_POINT");
  return code == 128 + SIGKILL ? -1 : code;  // through a shell, its child's SIGKILL is 137
}

int sweep(const std::string& config, const std::string& out, const std::string& point) {
  return run_killed("sweep " + config + " --out " + out, point);
}

}  // namespace

TEST_CASE("a sweep killed at any of 24 write points resumes to the uninterrupted result", "[sweep][crash]") {
  const std::string dir = test::temp_dir("crash_resume");
  const std::string config = dir + "/sweep.json";
  std::ofstream(config) << kSweep;
  REQUIRE(sweep(config, dir + "/reference", "") == 0);
  const auto reference = comparable_rows(dir + "/reference");
  REQUIRE(reference.size() == 9);

  // Each scenario: the kill points of successive runs; the last run is never killed.
  std::vector<std::vector<std::string>> scenarios;
  for (int cell = 1; cell <= 6; ++cell)
    for (const char* point : {"append-before-write", "append-mid-write", "append-before-fsync"})
      scenarios.push_back({std::string(point) + ":" + std::to_string(cell)});
  // A torn cell makes the resume rewrite results.csv; kill that rewrite too.
  for (int cell : {4, 6}) {
    const std::string torn = "append-mid-write:" + std::to_string(cell);
    scenarios.push_back({torn, "rewrite-before-publish:1"});
    scenarios.push_back({torn, "append-mid-write:1"});   // inside the rewrite's own write
    scenarios.push_back({torn, "append-before-fsync:1"});
  }
  REQUIRE(scenarios.size() >= 20);

  for (size_t i = 0; i < scenarios.size(); ++i) {
    const std::string out = dir + "/run" + std::to_string(i);
    std::string trail;
    for (const auto& point : scenarios[i]) {
      trail += point + " ";
      INFO("kill points: " << trail);
      CHECK(sweep(config, out, point) == -1);  // the kill really happened
      if (point.rfind("append-mid-write", 0) == 0 && point != "append-mid-write:1") {
        const std::string text = test::read_text(out + "/results.csv");
        CHECK((!text.empty() && text.back() != '\n'));  // and really tore the write
      }
    }
    INFO("kill points: " << trail);
    CHECK(sweep(config, out, "") == 0);
    CHECK(comparable_rows(out) == reference);
  }
}

TEST_CASE("merge and table killed at each write point leave whole files and finish when rerun", "[sweep][crash]") {
  const std::string dir = test::temp_dir("crash_merge_table");
  const std::string config = dir + "/sweep.json";
  std::ofstream(config) << kSweep;
  for (int shard : {0, 1})
    REQUIRE(run_killed("sweep " + config + " --out " + dir + "/s" + std::to_string(shard) + " --shard " +
                        std::to_string(shard) + "/2",
                    "") == 0);
  const std::string shards = dir + "/s0 " + dir + "/s1";
  REQUIRE(run_killed("merge " + shards + " --out " + dir + "/reference", "") == 0);
  const auto reference = comparable_rows(dir + "/reference");
  REQUIRE(reference.size() == 9);

  SECTION("merge") {
    // config.json (which marks the folder as this sweep's merge) is renamed in first, then
    // the rows go to a temporary file (append_rows_durably's three points) renamed over
    // results.csv. Killed between the two renames, the merge used to refuse its own folder.
    for (const char* point : {"append-before-write:1", "append-mid-write:1", "append-before-fsync:1",
                              "publish-before-rename:1", "publish-before-rename:2"}) {
      INFO("kill point " << point);
      const std::string out = dir + "/merged_" + point;
      CHECK(run_killed("merge " + shards + " --out '" + out + "'", point) == -1);
      // Either no results.csv or the whole one, never a part.
      if (fs::exists(out + "/results.csv")) CHECK(comparable_rows(out) == reference);
      CHECK(run_killed("merge " + shards + " --out '" + out + "'", "") == 0);
      CHECK(comparable_rows(out) == reference);
    }
  }
  SECTION("table") {
    const std::string table = "table " + dir + "/reference --rows task,metric --cols policy --out ";
    REQUIRE(run_killed(table + dir + "/want", "") == 0);
    const std::string want_md = test::read_text(dir + "/want.md"), want_csv = test::read_text(dir + "/want.csv");
    REQUIRE(want_md.find("| copa") != std::string::npos);
    // Killed before the .md's rename, before the .csv's: an earlier table stays whole.
    for (int point : {1, 2}) {
      INFO("kill point publish-before-rename:" << point);
      const std::string out = dir + "/table" + std::to_string(point);
      std::ofstream(out + ".md") << "earlier table\n";
      std::ofstream(out + ".csv") << "earlier,table\n";
      CHECK(run_killed(table + out, "publish-before-rename:" + std::to_string(point)) == -1);
      CHECK(test::read_text(out + ".md") == (point == 1 ? "earlier table\n" : want_md));
      CHECK(test::read_text(out + ".csv") == "earlier,table\n");
      CHECK(run_killed(table + out, "") == 0);
      CHECK(test::read_text(out + ".md") == want_md);
      CHECK(test::read_text(out + ".csv") == want_csv);
    }
  }
}
