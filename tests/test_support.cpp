#include "tests/test_support.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/common/data_dir.h"
#include "harness/model/model.h"

namespace kvevict::test {

std::string data(const std::string& relative) { return kvevict::data_path(relative); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Model& stories() {
  static auto model = [] {
    auto loaded = Model::load(data("models/stories260K-hf"));
    use_threads_for(*loaded, 0);  // as the CLI does: a tiny model runs each op on one thread
    return loaded;
  }();
  return *model;
}

std::vector<int> golden_tokens() {
  return read_json(data("golden/stories260K_tinystories_T200.json"))["tokens"].get<std::vector<int>>();
}

std::string temp_dir(const std::string& name) {
  // The process id keeps concurrent test runs (ctest -j, other checkouts) apart.
  auto dir = std::filesystem::temp_directory_path() /
             ("kvevict_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string kvevict_binary() {
  // Another build (an older commit, a sanitizer build) can be put under the same CLI tests.
  const char* other = std::getenv("KVEVICT_TEST_BINARY");
  return other && *other ? other : KVEVICT_BINARY;
}

std::string self_binary() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

CommandResult run_command(const std::string& command_line) {
  static int counter = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("kvevict_cmd_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  std::string out = (dir / "out").string(), err = (dir / "err").string();
  std::string cmd = command_line + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  CommandResult result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out),
                       read_text(err)};
  std::filesystem::remove_all(dir);
  return result;
}

std::pair<int, long> run_kvevict_peak_memory(const std::string& args) {
  const std::string command = "exec " + kvevict_binary() + " " + args + " >/dev/null 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || ::wait4(pid, &status, 0, &usage) != pid) return {-1, 0};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, usage.ru_maxrss};
}

CommandResult run_kvevict(const std::string& args) { return run_command(kvevict_binary() + " " + args); }

}  // namespace kvevict::test
