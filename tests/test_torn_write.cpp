// A kill -9 that really tears a results row: the test first makes sure the file ends
// inside a row (the earlier SIGKILL test passes whether or not that ever happened),
// then checks that reading repairs it and appending resumes after the whole rows.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "notebooks-export/results_csv.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using kvevict::ResultRow;

namespace {

ResultRow row_of(const std::string& model, const std::string& metric) {
  ResultRow row;
  row.model = model;
  row.task = "copa";
  row.policy = "h2o";
  row.budget = 0.2;
  row.protocol = "stream";
  row.mode = "simulation";
  row.score = "sum";
  row.metric = metric;
  row.value = 0.5;
  row.n = 10;
  return row;
}

char last_byte(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(-1, std::ios::end);
  return static_cast<char>(in.get());
}

}  // namespace

TEST_CASE("a kill -9 during a large append tears the last row, and resuming repairs it", "[export][kill]") {
  const std::vector<ResultRow> small = {row_of("small", "acc"), row_of("small", "acc_norm")};
  // One row of 48 MB: its single write() takes long enough to be killed halfway (the
  // kernel stops a write between pages when a fatal signal is pending).
  const std::vector<ResultRow> huge = {row_of(std::string(48 << 20, 'm'), "acc")};
  bool torn = false;
  std::string path;
  for (int attempt = 0; attempt < 8 && !torn; ++attempt) {
    path = kvevict::test::temp_dir("torn_write_" + std::to_string(attempt)) + "/results.csv";
    kvevict::append_rows_durably(path, small);
    const auto whole_size = fs::file_size(path);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        for (;;) kvevict::append_rows_durably(path, huge);
      } catch (...) {
      }
      ::_exit(1);
    }
    // Kill as soon as the huge row has started to land on the file.
    for (int waited = 0; waited < 20000; ++waited) {
      std::error_code error;
      if (fs::file_size(path, error) > whole_size && !error) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    torn = last_byte(path) != '\n';
  }
  INFO("no attempt left a torn row; the test cannot check the repair");
  REQUIRE(torn);
  const auto torn_size = fs::file_size(path);

  // Reading ignores the torn row, and repair cuts it off.
  auto rows = kvevict::read_results_csv(path);
  REQUIRE(rows.size() >= 2);
  CHECK(rows[0].fields() == small[0].fields());
  CHECK(rows[1].fields() == small[1].fields());
  const size_t whole = rows.size();
  CHECK(fs::file_size(path) == torn_size);  // reading alone leaves the file as it is
  kvevict::read_results_csv(path, true);
  CHECK(fs::file_size(path) < torn_size);
  CHECK(last_byte(path) == '\n');
  // Appending resumes after the whole rows.
  kvevict::append_rows_durably(path, small);
  rows = kvevict::read_results_csv(path);
  REQUIRE(rows.size() == whole + 2);
  CHECK(rows[whole].fields() == small[0].fields());
  CHECK(rows[whole + 1].fields() == small[1].fields());
  fs::remove_all(fs::path(path).parent_path());
}
