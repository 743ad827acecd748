// What the tests leave in $TMPDIR: nothing. A case's folders go when it ends, even when a
// REQUIRE fails or it throws, and the fork server removes its folder when its client dies.
#include <sys/wait.h>

#include "tests/catch.h"
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace kvevict;

namespace {

// Where the hidden cases below say which folder they made (set by the case that runs them).
void record_folder(const std::string& dir) {
  const char* record = std::getenv("KVEVICT_TEST_FOLDER_RECORD");
  if (record) std::ofstream(record) << dir;
  std::ofstream(dir + "/file") << "made by the case";
}

}  // namespace

// Hidden ([.]): run only in a child process by the case after them.
TEST_CASE("a case whose REQUIRE fails", "[.][temp-folder-failing]") {
  record_folder(test::temp_dir("failing_require"));
  REQUIRE(1 + 1 == 3);
}
TEST_CASE("a case that throws", "[.][temp-folder-throwing]") {
  record_folder(test::temp_dir("throwing"));
  throw std::runtime_error("thrown mid-case");
}

TEST_CASE("a test case's temporary folders are removed when it fails or throws", "[temp-folders]") {
  const test::TempDir scratch("temp_folder_record");
  for (const std::string tag : {"[temp-folder-failing]", "[temp-folder-throwing]"}) {
    INFO(tag);
    const std::string record = scratch.path() + "/record";
    fs::remove(record);
    const auto r = test::run_command("KVEVICT_TEST_FOLDER_RECORD=" + record + " " + test::self_binary() + " '" + tag + "'");
    CHECK(r.exit_code != 0);  // the case did fail
    const std::string made = test::read_text(record);
    REQUIRE(made.find("kvevict_test_") != std::string::npos);
    CHECK_FALSE(fs::exists(made));
  }
}

TEST_CASE("a TempDir is removed when it goes, with what it holds", "[temp-folders]") {
  std::string path;
  {
    const test::TempDir dir("scoped");
    path = dir.path();
    fs::create_directories(path + "/a/b");
    std::ofstream(path + "/a/b/c") << "x";
    CHECK(fs::is_directory(path));
  }
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("the fork server removes its run-files folder when its client goes", "[temp-folders][cli]") {
  // One request (kvevict --version) on stdin, then end of input: what a client that has
  // died looks like to the server. Its reply and the run's files are in the folder it removes.
  const test::TempDir scratch("fork_server_client");
  const std::string folder = scratch.path() + "/runs";
  fs::create_directories(folder);
  std::string request;
  for (const std::string field : {scratch.path(), folder + "/0.out", folder + "/0.err", std::string("2"),
                                  test::kvevict_binary(), std::string("--version"), std::string("0")})
    request += field + '\0';
  std::ofstream(scratch.path() + "/request", std::ios::binary) << request;
  const auto r = test::run_command("KVEVICT_FORK_SERVER=1 KVEVICT_FORK_SERVER_FOLDER=" + folder + " " +
                                   test::kvevict_binary() + " < " + scratch.path() + "/request");
  CHECK(r.exit_code == 0);
  CHECK(r.out == "0\n");  // the run's wait status: it exited 0
  CHECK_FALSE(fs::exists(folder));
}
