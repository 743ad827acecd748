// `kvevict serve`'s HTTP server (cpp-httplib): the OpenAI completions route, the
// tokenizer routes lm-eval's remote tokenizer uses, models, health and Prometheus
// metrics; a bounded queue in front of N workers that share one read-only model (and,
// above batch size 1, one batcher that runs their model calls together).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/server/completion.h"

namespace kvevict::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;           // 0: any free port
  int workers = 1;           // requests computed at once (with batching: feeding the batcher)
  int max_queue = 64;        // requests waiting for a worker; one more gets 503
  std::string api_key;       // "": no authentication
  std::string model_name;    // the id /v1/models lists
  int io_timeout_seconds = 60;     // writing an answer: each write may wait this long for the client
  int request_timeout_ms = 10000;  // a request's head and body must arrive within this, else 408
  int max_connections = 1024;      // open connections held at once; one more gets 503
  // Host names the Host and Origin headers may carry (a browser page elsewhere, or a DNS
  // name rebound to this machine, is refused with 403). Empty: the loopback names when
  // bound to a loopback address; any otherwise.
  std::vector<std::string> allowed_hosts;
};

// The bounds serve's flags are checked against (the same numbers its --help gives).
constexpr int kMaxWorkers = 256;
constexpr int kMaxQueue = 1024;
constexpr int kMaxConnections = 65536;

// Whether `host` (an address or name to bind) is this machine's loopback only.
bool is_loopback_host(const std::string& host);

// One line per request (method, path, status, tokens, milliseconds) and other notices.
using LogLine = std::function<void(const std::string&)>;

class Server {
 public:
  Server(const Completer& completer, ServerOptions options, LogLine log);
  ~Server();
  // Binds the socket; returns the port (the one chosen for port 0). Throws kvevict::Error.
  int bind();
  // Answers requests until stop(); returns once the requests in flight have been answered.
  void serve();
  // From any thread (not from a signal handler): stop accepting and let serve() return.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvevict::server
