#include "harness/server/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <type_traits>

#include "harness/common/errors.h"
#include "harness/server/connection_gate.h"

namespace kvevict::server {

namespace {

using nlohmann::json;

// Admits at most `workers` requests to compute at once and `max_queue` more to wait; a
// request beyond that is refused at once (503) instead of waiting without bound.
class Admission {
 public:
  Admission(int workers, int max_queue) : workers_(workers), capacity_(workers + max_queue) {}
  bool try_enter() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (inside_ >= capacity_) return false;
    ++inside_;
    return true;
  }
  void wait_for_worker() {
    std::unique_lock<std::mutex> lock(mutex_);
    free_.wait(lock, [&] { return running_ < workers_; });
    ++running_;
  }
  void leave(bool was_running) {
    std::lock_guard<std::mutex> lock(mutex_);
    --inside_;
    if (was_running) --running_;
    free_.notify_one();
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mutex_);
    return inside_ - running_;
  }
  int running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  int workers_, capacity_;
  int inside_ = 0, running_ = 0;
};

// A worker slot held for the life of one request (released also when an answer is
// streamed after the handler returned).
class AdmissionTicket {
 public:
  explicit AdmissionTicket(Admission& admission) : admission_(admission) {}
  ~AdmissionTicket() { admission_.leave(running_); }
  void run() {
    admission_.wait_for_worker();
    running_ = true;
  }

 private:
  Admission& admission_;
  bool running_ = false;
};

// A request the gate read whole, as httplib's parser reads it: its bytes, then the
// connection's socket for the answer (each write bounded by the write timeout).
class WholeRequestStream final : public httplib::Stream {
 public:
  WholeRequestStream(int fd, std::string request, int write_timeout_ms)
      : fd_(fd), request_(std::move(request)), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return position_ < request_.size(); }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return ::poll(&p, 1, write_timeout_ms_) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - position_);
    std::memcpy(ptr, request_.data() + position_, n);
    position_ += n;
    return static_cast<ssize_t>(n);
  }
  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(write_timeout_ms_);
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLOUT, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return -1;  // the client stopped reading
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(::getsockname, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage storage{};
    socklen_t length = sizeof storage;
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (storage.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      port = ntohs(in->sin_port);
    } else if (storage.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
      port = ntohs(in6->sin6_port);
    }
    ip = text;
  }
  int fd_;
  std::string request_;
  size_t position_ = 0;
  int write_timeout_ms_;
};

// httplib's server with its connection handling replaced: each accepted socket goes to the
// gate, and each whole request the gate reads is parsed, routed and answered by answer()
// on a worker (httplib's own parser, routes and response writer).
class GatedHttpServer final : public httplib::Server {
 public:
  std::function<void(int)> on_accept;
  // False: the connection must be closed (its answer could not be written, or it asked).
  bool answer(httplib::Stream& stream, bool& connection_closed) {
    return answer_with(*this, stream, connection_closed, 0);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    on_accept(sock);
    return true;
  }
  // httplib 0.18 passes the peer's address in; 0.11 asks the stream.
  template <typename Self>
  static auto answer_with(Self& self, httplib::Stream& stream, bool& closed, int)
      -> decltype(self.process_request(stream, std::string(), 0, std::string(), 0, false, closed, nullptr)) {
    std::string remote_ip, local_ip;
    int remote_port = 0, local_port = 0;
    stream.get_remote_ip_and_port(remote_ip, remote_port);
    stream.get_local_ip_and_port(local_ip, local_port);
    return self.process_request(stream, remote_ip, remote_port, local_ip, local_port, false, closed, nullptr);
  }
  template <typename Self>
  static auto answer_with(Self& self, httplib::Stream& stream, bool& closed, long)
      -> decltype(self.process_request(stream, false, closed, nullptr)) {
    return self.process_request(stream, false, closed, nullptr);
  }
};

// httplib's accept loop hands each socket straight on (to the gate) on its own thread.
using EnqueueResult = decltype(std::declval<httplib::TaskQueue&>().enqueue(std::function<void()>()));
class HandOnQueue final : public httplib::TaskQueue {
 public:
  EnqueueResult enqueue(std::function<void()> task) override {
    task();
    return static_cast<EnqueueResult>(true);
  }
  void shutdown() override {}
};

// Threads for whole requests, made when a request finds none idle, up to `most`.
class WorkerPool {
 public:
  explicit WorkerPool(int most) : most_(most) {}
  ~WorkerPool() { finish(); }
  // False when no thread can take it (none could be made).
  bool submit(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) return false;
    jobs_.push_back(std::move(job));
    if (idle_ == 0 && static_cast<int>(threads_.size()) < most_) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        if (threads_.empty()) {
          jobs_.pop_back();
          return false;
        }
      }
    }
    ready_.notify_one();
    return true;
  }
  // Runs the jobs queued, then joins every thread.
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finishing_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      ready_.wait(lock, [&] { return finishing_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int most_, idle_ = 0;
  bool finishing_ = false;
};

struct Metrics {
  std::atomic<long long> requests{0}, errors{0}, rejected{0}, tokens_scored{0}, tokens_generated{0};
  std::mutex mutex;
  double kv_kept = 0, kv_full = 0;  // summed over choices
};

// Per request, on the thread that handles it: when it started and the tokens it used.
struct RequestLog {
  std::chrono::steady_clock::time_point started;
  long long tokens = 0;
};
thread_local RequestLog request_log;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const RequestError& error) {
  res.status = error.status();
  res.set_content(dump(error_json(error)), "application/json");
}

json logprobs_json(const Choice& c) {
  json top = json::array();
  for (size_t e = 0; e < c.top_logprobs.size(); ++e) {
    if (e == 0 && std::isnan(c.token_logprobs[e])) {
      top.push_back(nullptr);
      continue;
    }
    json entry = json::object();
    for (const auto& [text, logprob] : c.top_logprobs[e]) entry[text] = json_safe_logprob(logprob);
    top.push_back(entry);
  }
  json values = json::array();
  for (double lp : c.token_logprobs) values.push_back(std::isnan(lp) ? json(nullptr) : json(json_safe_logprob(lp)));
  return json{{"tokens", c.tokens}, {"token_logprobs", values}, {"top_logprobs", top}, {"text_offset", c.text_offset}};
}

// The host of a Host header or an Origin's authority ("name", "name:port", "[v6]:port",
// "name/path"), lower-cased, brackets and port removed.
std::string host_name_of(std::string text) {
  text = text.substr(0, text.find('/'));
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!text.empty() && text.front() == '[') return text.substr(1, text.find(']') == std::string::npos ? std::string::npos : text.find(']') - 1);
  if (std::count(text.begin(), text.end(), ':') == 1) text = text.substr(0, text.find(':'));
  return text;
}

std::string completion_id() {
  static std::atomic<long long> next{0};
  return "cmpl-kvevict-" + std::to_string(++next);
}

}  // namespace

struct Server::Impl {
  const Completer& completer;
  ServerOptions options;
  LogLine log;
  GatedHttpServer http;
  Admission admission;
  Metrics metrics;
  WorkerPool pool;
  std::unique_ptr<ConnectionGate> gate;

  Impl(const Completer& c, ServerOptions o, LogLine l)
      : completer(c),
        options(std::move(o)),
        log(std::move(l)),
        admission(options.workers, options.max_queue),
        pool(options.workers + options.max_queue + 4) {}  // waiting requests hold a thread each

  // On a worker: httplib parses, routes and answers the request; then the gate reads the
  // connection's next one.
  void answer(int fd, std::string request) {
    WholeRequestStream stream(fd, std::move(request), options.io_timeout_seconds * 1000);
    bool closed = false;
    const bool written = http.answer(stream, closed);
    gate->resume(fd, written && !closed);
  }

  void start_gate() {
    GateOptions g;
    g.framing.max_body_bytes = limits().max_body_bytes;
    g.request_timeout_ms = options.request_timeout_ms;
    g.max_connections = options.max_connections;
    gate = std::make_unique<ConnectionGate>(
        g,
        [this](int fd, std::string request) {
          auto job = [this, fd, request = std::move(request)]() mutable { answer(fd, std::move(request)); };
          if (!pool.submit(std::move(job))) {
            ConnectionGate::send_refusal(fd, 503, "the server cannot start a thread for the request; retry later");
            ++metrics.errors;
            gate->resume(fd, false);
          }
        },
        [this](const GateRefusal& refusal) {
          ++metrics.errors;
          if (log)
            log((refusal.method.empty() ? std::string("-") : refusal.method) + " " +
                (refusal.target.empty() ? std::string("-") : refusal.target) + " " + std::to_string(refusal.status) +
                " refused: " + refusal.message);
        });
    http.on_accept = [this](int fd) { gate->adopt(fd); };
  }

  RequestLimits limits() const { return completer.settings().limits; }

  json choice_json(const Choice& c, int index) const {
    json j = {{"index", index}, {"text", c.text}, {"finish_reason", c.finish_reason}, {"logprobs", nullptr}};
    if (c.has_logprobs) j["logprobs"] = logprobs_json(c);
    return j;
  }

  void count(const std::vector<Choice>& choices) {
    long long prompt = 0, generated = 0;
    double kept = 0, full = 0;
    for (const Choice& c : choices) {
      prompt += c.prompt_tokens;
      generated += c.completion_tokens;
      kept += c.kv_tokens_kept;
      full += c.kv_tokens_full;
    }
    metrics.tokens_scored += prompt;
    metrics.tokens_generated += generated;
    request_log.tokens = prompt + generated;
    std::lock_guard<std::mutex> lock(metrics.mutex);
    metrics.kv_kept += kept;
    metrics.kv_full += full;
  }

  json completion_json(const std::vector<Choice>& choices, const std::string& id) const {
    json out = {{"id", id}, {"object", "text_completion"}, {"created", static_cast<long long>(std::time(nullptr))},
                {"model", options.model_name}, {"choices", json::array()}};
    long long prompt = 0, generated = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      out["choices"].push_back(choice_json(choices[i], static_cast<int>(i)));
      prompt += choices[i].prompt_tokens;
      generated += choices[i].completion_tokens;
    }
    out["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
    return out;
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    auto request = std::make_shared<CompletionRequest>(parse_completion_request(req.body, limits()));
    auto prepared = std::make_shared<Completer::Prepared>(completer.prepare(*request));
    if (!admission.try_enter()) {
      ++metrics.rejected;
      res.set_header("Retry-After", "1");
      throw RequestError(503,
                         "the server is busy: " + std::to_string(options.workers) + " worker(s) and a queue of " +
                             std::to_string(options.max_queue) + " are full; retry later",
                         "", "server_error", "queue_full");
    }
    auto ticket = std::make_shared<AdmissionTicket>(admission);
    const std::string id = completion_id();
    if (!request->stream) {
      ticket->run();
      std::vector<Choice> choices = completer.complete(*prepared, {});
      count(choices);
      res.set_content(dump(completion_json(choices, id)), "application/json");
      return;
    }
    // Server-sent events: one chunk per piece of text as it is generated, then a chunk per
    // choice with its finish reason, then [DONE]. The work runs as the answer is written.
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, request, prepared, ticket, id](size_t, httplib::DataSink& sink) {
          auto event = [&](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            return sink.is_writable() && sink.write(line.data(), line.size());
          };
          auto chunk = [&](int index, const std::string& text, const json& finish) {
            json c = {{"id", id}, {"object", "text_completion"}, {"created", static_cast<long long>(std::time(nullptr))},
                      {"model", options.model_name},
                      {"choices", json::array({json{{"index", index}, {"text", text}, {"logprobs", nullptr},
                                                    {"finish_reason", finish}}})}};
            return event(c);
          };
          ticket->run();
          try {
            std::vector<Choice> choices =
                completer.complete(*prepared, [&](int index, const std::string& text) { return chunk(index, text, nullptr); });
            count(choices);
            for (size_t i = 0; i < choices.size(); ++i) chunk(static_cast<int>(i), "", choices[i].finish_reason);
          } catch (const RequestError& e) {
            event(error_json(e));
          } catch (const std::exception& e) {
            event(error_json(RequestError(500, std::string("internal error: ") + e.what(), "", "server_error")));
          }
          const std::string done = "data: [DONE]\n\n";
          if (sink.is_writable()) sink.write(done.data(), done.size());
          sink.done();
          return true;
        });
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    bool add_special = false;
    const std::string text = parse_tokenize_request(req.body, limits(), &add_special);
    const Model& model = completer.model();
    std::vector<int> ids = add_special ? model.encode(text, true) : model.require_tokenizer().encode(text);
    res.set_content(dump(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", limits().context}}),
                    "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    const std::vector<int> ids = parse_detokenize_request(req.body, limits());
    res.set_content(dump(json{{"prompt", completer.model().require_tokenizer().decode(ids)}}), "application/json");
  }

  void tokenizer_info(httplib::Response& res) {
    const Model& model = completer.model();
    const Tokenizer& tokenizer = model.require_tokenizer();
    // A control token (SentencePiece's <s>, </s>) decodes to no text: null, not "" (lm-eval
    // adds eos_token to every stop list and takes encode(token)[0] as the token's id).
    auto special = [&](int id) {
      const std::string text = id >= 0 ? tokenizer.decode({id}) : std::string();
      return text.empty() ? json(nullptr) : json(text);
    };
    json info = {{"eos_token", special(model.arch().eos_token_id)},
                 {"bos_token", special(model.arch().bos_token_id)},
                 {"eos_token_id", model.arch().eos_token_id},
                 {"bos_token_id", model.arch().bos_token_id},
                 {"pad_token", nullptr},
                 {"model_max_length", limits().context},
                 {"vocab_size", tokenizer.vocab_size()}};
    res.set_content(dump(info), "application/json");
  }

  void metrics_text(httplib::Response& res) {
    std::ostringstream out;
    double kept = 0, full = 0;
    {
      std::lock_guard<std::mutex> lock(metrics.mutex);
      kept = metrics.kv_kept;
      full = metrics.kv_full;
    }
    auto counter = [&](const char* name, const char* help, long long value) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << value << "\n";
    };
    counter("kvevict_requests_total", "completion requests answered", metrics.requests.load());
    counter("kvevict_request_errors_total", "requests refused (4xx or 5xx) on any route, the HTTP layer's refusals included",
            metrics.errors.load());
    counter("kvevict_requests_rejected_total", "completion requests refused with 503 (queue full)", metrics.rejected.load());
    counter("kvevict_prompt_tokens_total", "prompt tokens scored", metrics.tokens_scored.load());
    counter("kvevict_generated_tokens_total", "tokens generated", metrics.tokens_generated.load());
    out << "# HELP kvevict_queue_depth requests waiting for a worker\n# TYPE kvevict_queue_depth gauge\n"
        << "kvevict_queue_depth " << admission.waiting() << "\n";
    out << "# HELP kvevict_requests_running requests being computed\n# TYPE kvevict_requests_running gauge\n"
        << "kvevict_requests_running " << admission.running() << "\n";
    out << "# HELP kvevict_batch_size_limit sequences one model call may run (--batch-size)\n"
        << "# TYPE kvevict_batch_size_limit gauge\nkvevict_batch_size_limit " << completer.settings().batch_size << "\n";
    if (const auto batch = completer.batch_stats()) batch_metrics(out, *batch);
    out << "# HELP kvevict_kv_tokens_kept_total KV tokens held at the end of each choice (mean over layers), summed\n"
        << "# TYPE kvevict_kv_tokens_kept_total counter\nkvevict_kv_tokens_kept_total " << kept << "\n";
    out << "# HELP kvevict_kv_tokens_full_total KV tokens a full cache would hold at the end of each choice, summed\n"
        << "# TYPE kvevict_kv_tokens_full_total counter\nkvevict_kv_tokens_full_total " << full << "\n";
    res.set_content(out.str(), "text/plain; version=0.0.4");
  }

  // The batcher's model calls (only when --batch-size is above 1): how many sequences each
  // ran, as a Prometheus histogram with a bucket per power of two up to the batch size.
  static void batch_metrics(std::ostream& out, const StreamBatcher::Stats& batch) {
    out << "# HELP kvevict_batch_model_calls_total model calls (forward_batch) the batcher made\n"
        << "# TYPE kvevict_batch_model_calls_total counter\nkvevict_batch_model_calls_total " << batch.model_calls << "\n";
    out << "# HELP kvevict_batch_segments_total sequences run in them (one per request stream per call)\n"
        << "# TYPE kvevict_batch_segments_total counter\nkvevict_batch_segments_total " << batch.segments << "\n";
    out << "# HELP kvevict_batch_largest the most sequences one model call has run\n"
        << "# TYPE kvevict_batch_largest gauge\nkvevict_batch_largest " << batch.largest << "\n";
    out << "# HELP kvevict_batch_running request streams in the batch now\n"
        << "# TYPE kvevict_batch_running gauge\nkvevict_batch_running " << batch.running << "\n";
    out << "# HELP kvevict_batch_waiting request streams waiting for a place in the batch\n"
        << "# TYPE kvevict_batch_waiting gauge\nkvevict_batch_waiting " << batch.waiting << "\n";
    out << "# HELP kvevict_batch_sequences sequences per model call\n# TYPE kvevict_batch_sequences histogram\n";
    const int most = static_cast<int>(batch.calls_of_size.size()) - 1;
    int64_t cumulative = 0;
    int counted = 0;  // sizes 0 .. counted are in `cumulative`
    auto bucket = [&](int le) {
      for (; counted < le; ++counted) cumulative += batch.calls_of_size[counted + 1];
      out << "kvevict_batch_sequences_bucket{le=\"" << le << "\"} " << cumulative << "\n";
    };
    for (int le = 1; le < most; le *= 2) bucket(le);
    bucket(most);
    out << "kvevict_batch_sequences_bucket{le=\"+Inf\"} " << cumulative << "\n"
        << "kvevict_batch_sequences_sum " << batch.segments << "\nkvevict_batch_sequences_count " << batch.model_calls
        << "\n";
  }

  // Every route's errors become OpenAI-style error bodies; nothing escapes to httplib.
  template <typename Body>
  httplib::Server::Handler guarded(Body body, bool counted = false) {
    return [this, body, counted](const httplib::Request& req, httplib::Response& res) {
      try {
        body(req, res);
        if (counted) ++metrics.requests;
      } catch (const RequestError& e) {
        ++metrics.errors;
        send_error(res, e);
      } catch (const std::exception& e) {
        ++metrics.errors;
        send_error(res, RequestError(500, std::string("internal error: ") + e.what(), "", "server_error"));
      }
    };
  }

  // The Host and Origin check (ServerOptions::allowed_hosts): "" when the request may pass.
  std::string misdirected(const httplib::Request& req) const {
    std::vector<std::string> allowed = options.allowed_hosts;
    if (allowed.empty()) {
      if (!is_loopback_host(options.host)) return "";
      allowed = {"localhost", "127.0.0.1", "::1", options.host};
    }
    auto is_allowed = [&](const std::string& name) {
      for (const auto& a : allowed)
        if (host_name_of(a) == name) return true;
      return false;
    };
    if (req.has_header("Host")) {
      const std::string host = req.get_header_value("Host");
      if (!is_allowed(host_name_of(host)))
        return "Host " + quoted_header_text(host, 80) + " is not a name this server answers to (--allowed-host)";
    }
    if (req.has_header("Origin")) {
      const std::string origin = req.get_header_value("Origin");
      const size_t scheme = origin.find("://");
      if (scheme == std::string::npos || !is_allowed(host_name_of(origin.substr(scheme + 3))))
        return "Origin " + quoted_header_text(origin, 80) + " may not call this server (--allowed-host)";
    }
    return "";
  }

  void routes() {
    http.Post("/v1/completions", guarded([this](const auto& req, auto& res) { completions(req, res); }, true));
    http.Post("/tokenize", guarded([this](const auto& req, auto& res) { tokenize(req, res); }));
    http.Post("/detokenize", guarded([this](const auto& req, auto& res) { detokenize(req, res); }));
    http.Get("/tokenizer_info", guarded([this](const auto&, auto& res) { tokenizer_info(res); }));
    http.Get("/v1/models", guarded([this](const auto&, auto& res) {
      json model = {{"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "kvevict"},
                    {"max_model_len", limits().context}};
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
    }));
    http.Get("/health", guarded([](const auto&, auto& res) { res.set_content("{\"status\":\"ok\"}", "application/json"); }));
    http.Get("/metrics", guarded([this](const auto&, auto& res) { metrics_text(res); }));

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      request_log = RequestLog{std::chrono::steady_clock::now(), 0};
      if (const std::string refusal = misdirected(req); !refusal.empty()) {
        ++metrics.errors;
        send_error(res, RequestError(403, refusal, "", "invalid_request_error", "host_not_allowed"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!options.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + options.api_key) {
        ++metrics.errors;
        send_error(res, RequestError(401, "missing or wrong API key: send \"Authorization: Bearer KEY\"", "",
                                     "invalid_request_error", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // httplib's own refusals (no route, a body over the limit, a malformed request line).
    // Counted here, before the answer is written (the logger runs after it).
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      ++metrics.errors;
      std::string message = "HTTP " + std::to_string(res.status);
      if (res.status == 404) message = "no route " + req.method + " " + req.path;
      if (res.status == 413) message = "request body exceeds the limit";
      if (res.status == 400) message = "malformed HTTP request";
      send_error(res, RequestError(res.status, message));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - request_log.started).count();
      std::ostringstream line;
      line << req.method << " " << req.path << " " << res.status << " tokens=" << request_log.tokens << " ms=";
      line.setf(std::ios::fixed);
      line.precision(1);
      line << ms;
      if (log) log(line.str());
    });
  }
};

namespace {

// Each bound is a flag's (serve_command.cpp names them the same way).
ServerOptions checked(ServerOptions o) {
  auto within = [](const char* flag, long long value, long long low, long long high) {
    if (value < low || value > high)
      throw Error(std::string(flag) + " " + std::to_string(value) + " is outside [" + std::to_string(low) + ", " +
                  std::to_string(high) + "]");
  };
  within("--workers", o.workers, 1, kMaxWorkers);
  within("--max-queue", o.max_queue, 0, kMaxQueue);
  within("--max-connections", o.max_connections, 1, kMaxConnections);
  within("--request-timeout (ms)", o.request_timeout_ms, 100, 3600 * 1000);
  // Each connection is a descriptor: raise the soft limit as far as the hard one allows.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    const rlim_t needed = static_cast<rlim_t>(o.max_connections) + 64;
    if (files.rlim_cur < needed && files.rlim_cur != RLIM_INFINITY) {
      files.rlim_cur = std::min(needed, files.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &files);
      ::getrlimit(RLIMIT_NOFILE, &files);
    }
    if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < needed)
      throw Error("--max-connections " + std::to_string(o.max_connections) + " needs " + std::to_string(needed) +
                  " open files, and this process may open " + std::to_string(files.rlim_cur) + " (ulimit -n)");
  }
  return o;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr address{};
  return ::inet_pton(AF_INET, host.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

Server::Server(const Completer& completer, ServerOptions options, LogLine log)
    : impl_(std::make_unique<Impl>(completer, checked(std::move(options)), std::move(log))) {
  impl_->routes();
  impl_->http.new_task_queue = [] { return new HandOnQueue; };
  // The gate has read and checked the whole body already; httplib's own limit only agrees.
  impl_->http.set_payload_max_length(static_cast<size_t>(impl_->limits().max_body_bytes));
  impl_->start_gate();
  // httplib writes a response's headers and body separately: without TCP_NODELAY, Nagle's
  // algorithm holds the body until the client's delayed ACK (40 ms per request). Accepted
  // sockets inherit it from the listening one.
  impl_->http.set_socket_options([](socket_t sock) {
    httplib::default_socket_options(sock);
    int yes = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
}

Server::~Server() {
  impl_->gate->stop();
  impl_->pool.finish();
}

int Server::bind() {
  const auto& o = impl_->options;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) throw Error("cannot bind " + o.host + " to a free port");
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    throw Error("cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use, or not an address of this machine)");
  }
  return port;
}

void Server::serve() {
  impl_->http.listen_after_bind();
  // Half-sent requests are dropped; the ones with a worker are answered first.
  impl_->gate->stop();
  impl_->pool.finish();
}

void Server::stop() { impl_->http.stop(); }

}  // namespace kvevict::server
