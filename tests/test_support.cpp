#include "tests/test_support.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wordexp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include "harness/common/data_dir.h"
#include "harness/common/files.h"
#include "policies/registry.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "notebooks-export/results_csv.h"

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

ModelOptions model_options() {
  ModelOptions options;
  if (const char* device = std::getenv("KVEVICT_TEST_DEVICE"); device && *device) options.device = device;
  return options;
}

const Model& stories() {
  static auto model = [] {
    auto loaded = Model::load(data("models/stories260K-hf"), model_options());
    use_threads_for(*loaded, 0);  // as the CLI does: a tiny model runs each op on one thread
    return loaded;
  }();
  return *model;
}

std::vector<int> golden_tokens() {
  return read_json(data("golden/stories260K_tinystories_T200.json"))["tokens"].get<std::vector<int>>();
}

bool needs_pattern_file(const std::string& policy_name) {
  for (const ParamSpec* p : make_policy(policy_name, {})->parameters())
    if (p->key() == "pattern_file") return true;
  return false;
}

bool needs_prepass(const std::string& policy_name) {
  return make_policy(policy_name, {})->prepass() != Prepass::None;
}

PolicyOptions runnable_on(const std::string& policy_name, const Model& model, PolicyOptions options) {
  if (!needs_pattern_file(policy_name)) return options;
  const int64_t layers = model.arch().n_layers, heads = model.arch().n_kv_heads;
  const std::string path = temp_dir("pattern_" + std::to_string(layers) + "x" + std::to_string(heads)) + "/heads.tsv";
  std::string text;
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h) text += std::to_string((l * 7 + h * 3) % 11 / 10.0) + (h + 1 < heads ? "\t" : "\n");
  std::ofstream(path) << text;
  options.params.set("pattern_file", path);
  return options;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TempDir::TempDir(const std::string& name) : owner_pid_(::getpid()) {
  // The process id keeps concurrent test runs (ctest -j, other checkouts) apart.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kvevict_test_" + std::to_string(owner_pid_) + "_" + name);
  if (!remove_tree(dir.string())) throw std::runtime_error("cannot remove " + dir.string());
  std::filesystem::create_directories(dir);
  path_ = dir.string();
}

TempDir::~TempDir() {
  if (::getpid() != owner_pid_) return;
  remove_tree(path_);  // a destructor reports nothing; a folder it cannot remove stays
}

namespace {
// The running test case's folders; a static, so whatever is left goes at exit.
std::vector<std::unique_ptr<TempDir>>& case_folders() {
  static std::vector<std::unique_ptr<TempDir>> folders;
  return folders;
}
}  // namespace

std::string temp_dir(const std::string& name) {
  case_folders().push_back(std::make_unique<TempDir>(name));
  return case_folders().back()->path();
}

std::vector<std::string> rows_without_timing(const std::string& dir) {
  std::vector<std::string> rows;
  for (auto row : read_results_csv(dir + "/results.csv")) {
    row.seconds.reset();
    rows.push_back(format_row(row));
  }
  return rows;
}

std::string write_older_results(const std::string& name, const std::vector<std::string>& missing, const ResultRow& row) {
  std::vector<std::string> older;
  for (const auto& column : result_columns())
    if (std::find(missing.begin(), missing.end(), column) == missing.end()) older.push_back(column);
  const auto fields = row.fields();
  std::string text;
  for (size_t i = 0; i < older.size(); ++i) text += (i ? "," : "") + older[i];
  text += "\n";
  for (size_t i = 0; i < older.size(); ++i) text += (i ? "," : "") + csv_quote(fields.at(older[i]));
  text += "\n";
  const std::string path = temp_dir(name) + "/results.csv";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string kvevict_binary() {
  // Another build (an older commit, a sanitizer build) can be put under the same CLI tests.
  const char* other = std::getenv("KVEVICT_TEST_BINARY");
  return other && *other ? other : KVEVICT_BINARY;
}

std::string self_binary() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

CommandResult run_command(const std::string& command_line) {
  static std::atomic<int> counter{0};
  const TempDir dir("cmd_" + std::to_string(counter++));
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  std::string cmd = command_line + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
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

namespace {

// This build's kvevict started once with KVEVICT_FORK_SERVER=1 (harness/cli/fork_server.h):
// each run is a child forked from it, the binary's own main in a process that loaded
// LibTorch once. One socket carries the requests and the replies.
class ForkServer {
 public:
  ForkServer() : folder_("fork_server") {}
  ~ForkServer() {
    if (socket_ >= 0) ::close(socket_);  // the server sees end of input and exits
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  // Where the runs' stdout and stderr files go: the server removes it when it ends, also
  // when this process is killed (its end of the socket then closes).
  const std::string& folder() const { return folder_.path(); }

  // The child's wait status, or nothing if the server cannot be reached.
  std::optional<int> run(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (socket_ < 0 && !start()) return std::nullopt;
    std::string request;
    auto field = [&](const std::string& text) { request.append(text).push_back('\0'); };
    field(std::filesystem::current_path().string());
    field(out);
    field(err);
    field(std::to_string(args.size()));
    for (const auto& arg : args) field(arg);
    size_t n_env = 0;
    for (char** entry = environ; *entry; ++entry) ++n_env;
    field(std::to_string(n_env));
    for (char** entry = environ; *entry; ++entry) field(*entry);
    for (size_t done = 0; done < request.size();) {
      const ssize_t sent = ::send(socket_, request.data() + done, request.size() - done, MSG_NOSIGNAL);
      if (sent <= 0) return fail();
      done += static_cast<size_t>(sent);
    }
    std::string reply;
    char c;
    while (::recv(socket_, &c, 1, 0) == 1) {
      if (c == '\n') return std::stoi(reply);
      reply.push_back(c);
    }
    return fail();
  }

 private:
  bool start() {
    if (failed_) return false;
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) return false;
    // Everything the child needs is made before fork: only dup2 and execve run after it.
    const std::string binary = KVEVICT_BINARY;
    std::vector<std::string> environment = {"KVEVICT_FORK_SERVER=1", "KVEVICT_FORK_SERVER_FOLDER=" + folder()};
    for (char** entry = environ; *entry; ++entry)
      if (std::string(*entry).rfind("KVEVICT_FORK_SERVER", 0) != 0) environment.push_back(*entry);
    std::vector<char*> envp;
    for (auto& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>(binary.c_str()), nullptr};
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::dup2(ends[1], 0) < 0 || ::dup2(ends[1], 1) < 0) ::_exit(127);
      ::execve(binary.c_str(), argv, envp.data());
      ::_exit(127);
    }
    ::close(ends[1]);
    if (pid_ < 0) {
      ::close(ends[0]);
      failed_ = true;
      return false;
    }
    socket_ = ends[0];
    return true;
  }
  std::nullopt_t fail() {
    ::close(socket_);
    socket_ = -1;
    failed_ = true;  // from now on every run starts its own process
    return std::nullopt;
  }

  TempDir folder_;
  std::mutex mutex_;
  int socket_ = -1;
  pid_t pid_ = -1;
  bool failed_ = false;
};

}  // namespace

CommandResult run_kvevict(const std::string& args) {
  const char* other = std::getenv("KVEVICT_TEST_BINARY");
  const char* off = std::getenv("KVEVICT_TEST_NO_FORK_SERVER");
  wordexp_t words;
  // Arguments that need more of a shell than its words (redirections, pipes, $(...)), and
  // another binary, which may not serve forks, run through the shell as before.
  if ((other && *other) || (off && *off) || ::wordexp(args.c_str(), &words, WRDE_NOCMD) != 0)
    return run_command(kvevict_binary() + " " + args);
  std::vector<std::string> argv = {KVEVICT_BINARY};
  for (size_t i = 0; i < words.we_wordc; ++i) argv.push_back(words.we_wordv[i]);
  ::wordfree(&words);
  static ForkServer server;
  static std::atomic<int> counter{0};
  const int run = counter++;
  const std::string out = server.folder() + "/" + std::to_string(run) + ".out";
  const std::string err = server.folder() + "/" + std::to_string(run) + ".err";
  // Each run's files go once read, also when reading them throws.
  struct RemoveAfter {
    std::string out, err;
    ~RemoveAfter() {
      std::remove(out.c_str());
      std::remove(err.c_str());
    }
  } remove_after{out, err};
  const auto status = server.run(argv, out, err);
  if (!status) return run_command(kvevict_binary() + " " + args);
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, read_text(out), read_text(err)};
}

extern "C" void kvevict_test_case_ended() { case_folders().clear(); }

}  // namespace kvevict::test
