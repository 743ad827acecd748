// serve: the OpenAI-compatible completions server (harness/server/), its flags, the
// signals that stop it and the lines it prints.
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/cli/commands.h"
#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/output_paths.h"
#include "harness/eval/evaluator.h"
#include "harness/model/threads.h"
#include "harness/server/server.h"

namespace kvevict {
namespace {

struct ServeArgs {
  std::string model, mode = "sim", protocol = "stream", host = "127.0.0.1", port_file, api_key;
  std::vector<std::string> allowed_hosts;
  int port = 8000, workers = 0, max_queue = 64;  // workers 0: the batch size
  int max_connections = 1024;
  double request_timeout = 10;  // seconds
  int batch_size = 0;                             // 0: default_batch_size()
  server::RequestLimits limits;
  RuntimeFlags runtime;
  PolicyFlags policy;
};

void add_serve_flags(CLI::App& cmd, ServeArgs& a) {
  cmd.add_option("--model", a.model, "Hugging Face model directory (default: the bundled stories260K)");
  cmd.add_option("--mode", a.mode, "sim or decode")->check(CLI::IsMember({"sim", "decode"}))->capture_default_str();
  cmd.add_option("--protocol", a.protocol,
                 "stream (eviction from a prompt's first token) or prefill-compress (a request gives "
                 "\"kvevict\": {\"context_tokens\": n})")
      ->check(CLI::IsMember({"stream", "prefill-compress"}))
      ->capture_default_str();
  cmd.add_option("--host", a.host, "address to bind (anyone who reaches it may call the server)")->capture_default_str();
  cmd.add_option("--port", a.port, "port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd.add_option("--port-file", a.port_file, "write the bound port here once listening");
  cmd.add_option("--batch-size", a.batch_size,
                 "sequences run together in one model call, from concurrent requests, each with its own cache and "
                 "policy state (default: chosen from the model and the machine, as eval's); no number depends on it")
      ->check(cli::at_least(1));
  cmd.add_option("--workers", a.workers, "requests computed at once, one shared model (default: the batch size)")
      ->check(CLI::Range(1, server::kMaxWorkers));
  cmd.add_option("--max-queue", a.max_queue, "requests that may wait for a worker; more get 503")
      ->check(CLI::Range(0, server::kMaxQueue))->capture_default_str();
  cmd.add_option("--max-connections", a.max_connections,
                 "open connections held at once (each a buffer, not a thread, until its request is whole); more get 503")
      ->check(CLI::Range(1, server::kMaxConnections))->capture_default_str();
  cmd.add_option("--request-timeout", a.request_timeout,
                 "seconds a request's head and body may take to arrive, from its first byte; later: 408")
      ->check(cli::finite_range(0.1, 3600))->capture_default_str();
  cmd.add_option("--api-key", a.api_key, "require \"Authorization: Bearer KEY\"")
      ->check(CLI::Validator(
          [](std::string& key) -> std::string {
            return key.empty() ? "is empty (an unset variable?): give a key, or leave the flag out to serve without one"
                               : "";
          },
          "KEY"));
  cmd.add_option("--allowed-host", a.allowed_hosts,
                 "a name the Host and Origin headers may carry (repeatable; default: the loopback names when bound "
                 "to loopback, any otherwise); others get 403, which stops web pages and rebound DNS names");
  cmd.add_option("--max-body-bytes", a.limits.max_body_bytes, "largest request body")->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--max-prompts", a.limits.max_prompts, "prompts per request")->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--max-tokens-limit", a.limits.max_tokens, "largest max_tokens a request may ask")
      ->check(cli::at_least(0))->capture_default_str();
  a.runtime.add_to(cmd);
  a.policy.add_to(cmd);
}

// SIGINT/SIGTERM write a byte to this pipe (all a signal handler may safely do); a thread
// reading it stops the server, which then finishes the requests in flight.
int stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t written = write(stop_pipe[1], &byte, 1);
}

int run_serve(ServeArgs& a, const Invocation& at) {
  if (a.model.empty()) a.model = data_path("models/stories260K-hf", at.data_override);
  if (!a.port_file.empty()) check_output_file(a.port_file, "--port-file", CommandInputs().folder(a.model, "--model"));
  auto model = Model::load(a.model, a.runtime.options);
  use_threads_for(*model, a.runtime.options.threads);
  server::CompletionSettings settings;
  settings.mode = parse_mode(a.mode);
  settings.protocol = parse_protocol(a.protocol);
  settings.policy = a.policy.policy;
  settings.policy_options = a.policy.options;
  settings.limits = a.limits;
  settings.limits.context = static_cast<int>(model->arch().max_positions);
  settings.limits.vocab_size = static_cast<int>(model->arch().vocab);
  settings.batch_size = a.batch_size > 0 ? a.batch_size : default_batch_size(*model);
  // Said once, where a default batches, as eval says it.
  if (a.batch_size == 0 && settings.batch_size > 1)
    std::cerr << "batch size " << settings.batch_size << " (this model's default on this machine; --batch-size N to choose)"
              << std::endl;
  server::Completer completer(*model, settings);

  server::ServerOptions options;
  options.host = a.host;
  options.port = a.port;
  options.workers = a.workers > 0 ? a.workers : settings.batch_size;
  options.max_queue = a.max_queue;
  options.api_key = a.api_key;
  options.allowed_hosts = a.allowed_hosts;
  options.max_connections = a.max_connections;
  options.request_timeout_ms = static_cast<int>(a.request_timeout * 1000);
  options.model_name = std::filesystem::path(a.model).filename().string();
  if (options.model_name.empty()) options.model_name = std::filesystem::path(a.model).parent_path().filename().string();
  std::mutex log_mutex;
  server::Server server(completer, options, [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mutex);
    std::cerr << line << std::endl;
  });
  const int port = server.bind();
  // Before the stopper thread exists: a port file that cannot be written is an error exit.
  if (!a.port_file.empty()) {
    try {
      write_file_atomically(a.port_file, std::to_string(port) + "\n");
    } catch (const Error& e) {
      throw Error(std::string("--port-file ") + e.what());
    }
  }

  if (pipe(stop_pipe) != 0) throw Error("serve: cannot create the signal pipe");
  fcntl(stop_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::thread stopper([&] {
    char byte = 0;
    while (read(stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    if (byte == 1) std::cerr << "stopping: finishing the requests in flight" << std::endl;
    server.stop();
  });

  if (!server::is_loopback_host(a.host))
    std::cerr << "warning: --host " << a.host << " accepts connections from other machines"
              << (a.api_key.empty() ? ", without an API key (--api-key): anyone who reaches it may use the server" : "")
              << (a.allowed_hosts.empty() ? "; any Host or Origin header is accepted (--allowed-host)" : "") << std::endl;
  std::cerr << "listening on http://" << a.host << ":" << port << std::endl;
  server.serve();
  // serve() also returns when listening fails; wake the stopper either way.
  const char wake = 2;
  [[maybe_unused]] ssize_t written = write(stop_pipe[1], &wake, 1);
  stopper.join();
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, Commands& commands) {
  add_command<ServeArgs>(commands, app, "serve",
                         "OpenAI-compatible completions server (lm-evaluation-harness's local-completions) under a policy",
                         add_serve_flags, run_serve);
}

}  // namespace kvevict
