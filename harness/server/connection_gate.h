// The server's front door: one thread that holds every open connection (epoll) and reads
// each request whole, within a deadline, before handing it to a worker. A client that
// sends a byte every few seconds, a body that never comes or a Content-Length over the
// limit costs a buffer here and gets its 4xx in bounded time; the workers only ever see
// whole requests, so they stay free for the clients that send them.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "harness/server/http_framing.h"

namespace kvevict::server {

struct GateOptions {
  FramingLimits framing;
  int request_timeout_ms = 10000;  // a request's head and body, from its first byte
  int keep_alive_ms = 5000;        // an idle connection between requests
  int max_connections = 1024;      // held at once; one more gets 503
  int drain_ms = 2000;             // after a refusal, how long unread input is read and dropped
};

// A refused or timed-out request, for the log and the error count.
struct GateRefusal {
  std::string method, target;  // "" when the request line had not come
  int status = 0;
  std::string message;
};

class ConnectionGate {
 public:
  // Called on the gate's thread with a whole request's bytes: it must hand them on (to a
  // worker), not answer them there, and later call resume() for the connection.
  using OnRequest = std::function<void(int fd, std::string request)>;
  using OnRefusal = std::function<void(const GateRefusal&)>;
  // Starts the gate's thread (throws std::system_error when it cannot).
  ConnectionGate(GateOptions options, OnRequest on_request, OnRefusal on_refusal);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // A connection just accepted: the gate owns it from now on.
  void adopt(int fd);
  // A worker has answered the connection's request: read its next one (bytes already
  // received, a pipelined request, come first), or close it when !keep_open.
  void resume(int fd, bool keep_open);
  // Closes every connection that is not with a worker (half-sent requests included) and
  // stops the thread; connections resumed afterwards are closed.
  void stop();

  // An error answer with "Connection: close", written without blocking (best effort).
  static void send_refusal(int fd, int status, const std::string& message);

 private:
  enum class Phase { Reading, WithWorker, Draining };
  struct Connection {
    std::string buffer;  // received, not yet handed on
    Phase phase = Phase::Reading;
    std::chrono::steady_clock::time_point deadline;
    bool request_started = false;  // a byte of the current request has come
    bool continue_sent = false;
    bool peer_done = false;  // the client has shut its side: close once its request is answered
  };
  void loop();
  void read_from(int fd);
  // Frames the connection's buffer: hands on a whole request, refuses a bad one, or waits.
  void advance(int fd, Connection& connection, std::unique_lock<std::mutex>& lock);
  void refuse(int fd, Connection& connection, const Framing& framing, int status, const std::string& message,
              std::unique_lock<std::mutex>& lock);
  void close_connection(int fd);
  void expire(std::chrono::steady_clock::time_point now, std::unique_lock<std::mutex>& lock);
  int wait_ms(std::chrono::steady_clock::time_point now) const;
  void wake();

  GateOptions options_;
  OnRequest on_request_;
  OnRefusal on_refusal_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::mutex mutex_;
  std::map<int, Connection> connections_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvevict::server
