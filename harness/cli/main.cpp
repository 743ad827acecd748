// kvevict: the command-line front door. Each command file adds its subcommands; the one
// parsed runs, and an error becomes one line on stderr and exit 1.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "harness/cli/command.h"
#include "harness/cli/fork_server.h"
#include "harness/common/version.h"
#include "harness/model/threads.h"

namespace {

int run_command_line(int argc, char** argv) {
  using namespace kvevict;
  CLI::App app{"kvevict: KV-cache eviction policies on real language models"};
  app.require_subcommand(1);
  // One line, like every other error (CLI11's default adds a second "Run with --help" line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    return "kvevict: error: " + msg + " (see --help)\n";
  });
  app.set_version_flag("--version", kvevict_version());
  std::string data_override;
  app.add_option("--data-dir", data_override, "shared data folder (default: $KVEVICT_DATA or ../shared/data)");

  Commands commands;
  add_model_commands(app, commands);
  add_task_commands(app, commands);
  add_sweep_commands(app, commands);
  add_analyze_command(app, commands);
  add_serve_command(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every refused flag exits 1, as every other error
    // (CLI11's own codes, 105 to 114, are not the one README promises).
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    set_thread_count(0);  // all physical cores unless --threads says otherwise
    for (auto& command : commands)
      if (command->parsed()) return command->run(data_override);
    return 0;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "kvevict: error: " << msg << std::endl;
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The test suite's way to run this binary many times at one LibTorch load (fork_server.h).
  const char* fork_server = std::getenv("KVEVICT_FORK_SERVER");
  if (fork_server && std::string(fork_server) == "1") return kvevict::serve_forked_commands(run_command_line);
  kvevict::exit_without_static_destructors(run_command_line(argc, argv));
}
