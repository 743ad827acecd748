// `kvevict serve` as a child process for the server tests: the real binary on a free
// port, and a raw-socket client for what httplib's client cannot send (a request cut off,
// bytes sent slowly, two requests in one write).
#pragma once
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/catch.h"
#include "tests/test_support.h"

namespace kvevict {

// The server as a child process: started with --port 0 --port-file, stopped with SIGTERM.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& flags, const std::string& name) {
    dir_ = test::temp_dir("server_" + name);
    port_file_ = dir_ + "/port";
    log_ = dir_ + "/stderr";
    std::vector<std::string> args = {test::kvevict_binary(), "serve", "--port", "0", "--port-file", port_file_};
    args.insert(args.end(), flags.begin(), flags.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::freopen(log_.c_str(), "w", stderr);
      std::freopen("/dev/null", "w", stdout);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port) port_ = port;
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int status = 0;
      if (port_ == 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
    if (port_ == 0) FAIL("kvevict serve did not start: " << test::read_text(log_));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return test::read_text(log_); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    return c;
  }
  // SIGTERM; the exit status.
  int terminate() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  std::string dir_, port_file_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
};


// A connection opened with a plain socket: bytes go out exactly as given.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  RawConnection(RawConnection&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  bool open() const { return fd_ >= 0; }
  bool send(const std::string& bytes) {
    return fd_ >= 0 && ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // Everything the server sends until it closes the connection, or until `seconds` pass.
  std::string read_all(double seconds) {
    return receive_until([](const std::string&) { return false; }, seconds);
  }
  // Reads until `count` answers' heads have come (or `seconds` pass), then what follows
  // them at once (the last answer's body).
  std::string read_answers(int count, double seconds) {
    auto answered = [count](const std::string& out) {
      int n = 0;
      for (size_t at = out.find("HTTP/1.1 "); at != std::string::npos; at = out.find("HTTP/1.1 ", at + 1)) ++n;
      return n >= count;
    };
    std::string out = receive_until(answered, seconds);
    return out + receive_until([](const std::string&) { return false; }, 0.05);
  }

 private:
  // Appends what arrives until `done(received)`, the server closes, or `seconds` pass.
  template <typename Done>
  std::string receive_until(Done done, double seconds) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buffer[65536];
    while (fd_ >= 0 && !done(out)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  int fd_ = -1;
};

}  // namespace kvevict
