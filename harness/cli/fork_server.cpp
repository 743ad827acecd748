#include "harness/cli/fork_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace kvevict {

namespace {

// NUL-terminated fields from a file descriptor, with plain read(2): no stdio buffer a
// child could inherit and flush into its own stdout.
class FieldReader {
 public:
  explicit FieldReader(int fd) : fd_(fd) {}
  // False at end of input (or a read error).
  bool next(std::string& field) {
    field.clear();
    for (;;) {
      if (pos_ == end_) {
        ssize_t got;
        do got = ::read(fd_, buffer_, sizeof buffer_);
        while (got < 0 && errno == EINTR);
        if (got <= 0) return false;
        pos_ = 0;
        end_ = static_cast<size_t>(got);
      }
      const char c = buffer_[pos_++];
      if (c == '\0') return true;
      field.push_back(c);
    }
  }
  bool count(size_t& n) {
    std::string field;
    if (!next(field) || field.empty() || field.size() > 6) return false;
    n = 0;
    for (char c : field) {
      if (c < '0' || c > '9') return false;
      n = n * 10 + static_cast<size_t>(c - '0');
    }
    return true;
  }

 private:
  int fd_;
  char buffer_[65536];
  size_t pos_ = 0, end_ = 0;
};

// A socket's peer that has gone (the test process killed) is an error here, not a
// SIGPIPE: the server must live on to remove its folder.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t wrote = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (wrote < 0 && errno == ENOTSOCK) wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    done += static_cast<size_t>(wrote);
  }
  return true;
}

// In the child: the request's files as fds 0-2, its directory and environment, then main.
[[noreturn]] void run_child(CommandLineMain run, const std::string& cwd, const std::string& out_path,
                            const std::string& err_path, std::vector<std::string>& args,
                            std::vector<std::string>& environment) {
  const int in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0 || err < 0 || ::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 ||
      ::chdir(cwd.c_str()) != 0)
    ::_exit(127);
  ::close(in);
  ::close(out);
  ::close(err);
  ::clearenv();
  for (auto& entry : environment) ::putenv(entry.data());  // the strings outlive the child's main
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int code = run(static_cast<int>(args.size()), argv.data());
  exit_without_static_destructors(code);
}

}  // namespace

void exit_without_static_destructors(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

namespace {

// The folder the client keeps the runs' stdout and stderr files in
// (KVEVICT_FORK_SERVER_FOLDER), removed when the server ends: the client removes each
// run's files once read, so what a client killed mid-run leaves is the last run's files
// and the folder. Nothing else in it is touched, so a wrong folder loses nothing.
class RunFilesFolder {
 public:
  RunFilesFolder() {
    const char* folder = std::getenv("KVEVICT_FORK_SERVER_FOLDER");
    if (folder) folder_ = folder;
  }
  ~RunFilesFolder() {
    for (const auto& file : last_run_files_) ::unlink(file.c_str());
    if (!folder_.empty()) ::rmdir(folder_.c_str());
  }
  void run_writes(const std::string& out_path, const std::string& err_path) { last_run_files_ = {out_path, err_path}; }

 private:
  std::string folder_;
  std::vector<std::string> last_run_files_;
};

}  // namespace

int serve_forked_commands(CommandLineMain run) {
  FieldReader reader(0);
  RunFilesFolder run_files;
  for (;;) {
    std::string cwd, out_path, err_path;
    if (!reader.next(cwd)) return 0;  // the client closed stdin (it finished, or it died): done
    size_t n_args = 0, n_env = 0;
    if (!reader.next(out_path) || !reader.next(err_path) || !reader.count(n_args) || n_args == 0) return 1;
    run_files.run_writes(out_path, err_path);
    std::vector<std::string> args(n_args);
    for (auto& arg : args)
      if (!reader.next(arg)) return 1;
    if (!reader.count(n_env)) return 1;
    std::vector<std::string> environment(n_env);
    for (auto& entry : environment)
      if (!reader.next(entry)) return 1;
    const pid_t pid = ::fork();
    if (pid == 0) run_child(run, cwd, out_path, err_path, args, environment);
    int status = 0;
    if (pid < 0) {
      status = 127 << 8;  // as a shell reports a command it could not start
    } else {
      pid_t waited;
      do waited = ::waitpid(pid, &status, 0);
      while (waited < 0 && errno == EINTR);
    }
    if (!write_all(1, std::to_string(status) + "\n")) return 1;
  }
}

}  // namespace kvevict
