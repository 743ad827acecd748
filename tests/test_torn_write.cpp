// A results row really torn on disk by the kernel, then kill -9: the test makes the file
// end inside a row (the SIGKILL tests at kill points write the torn tail themselves), then
// checks that reading repairs it and appending resumes after the whole rows.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/catch.h"
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

TEST_CASE("a write the kernel cuts short, then kill -9, leaves a torn row that resuming repairs", "[export][kill]") {
  const std::vector<ResultRow> small = {row_of("small", "acc"), row_of("small", "acc_norm")};
  // One row of 48 MB, of which the file-size limit lets the kernel write only the first
  // MiB: the write() returns short, as one interrupted by a kill does, whatever the load
  // on the machine (a kill timed against a running write missed on a busy one).
  const std::vector<ResultRow> huge = {row_of(std::string(48 << 20, 'm'), "acc")};
  const std::string path = kvevict::test::temp_dir("torn_write") + "/results.csv";
  kvevict::append_rows_durably(path, small);
  const auto whole_size = fs::file_size(path);
  const auto limit = whole_size + (1 << 20);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // the write past the limit fails with EFBIG instead
    rlimit size_limit{};
    ::getrlimit(RLIMIT_FSIZE, &size_limit);
    size_limit.rlim_cur = limit;
    if (::setrlimit(RLIMIT_FSIZE, &size_limit) != 0) ::_exit(2);
    try {
      kvevict::append_rows_durably(path, huge);
    } catch (...) {
    }
    for (;;) ::pause();  // until the kill
  }
  for (int waited = 0; waited < 600000; ++waited) {  // at most a minute
    std::error_code error;
    if (fs::file_size(path, error) >= limit && !error) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  REQUIRE(fs::file_size(path) == limit);
  REQUIRE(last_byte(path) != '\n');
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
}
