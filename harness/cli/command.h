// One subcommand: the options struct its flags write into, owned together with the
// subcommand, and the body that runs when it was the one parsed. main.cpp asks each
// command file to add its commands; nothing lives in globals.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

namespace kvevict {

// What a command body may read besides its own options.
struct Invocation {
  const CLI::App& command;          // e.g. to ask whether a flag was given
  const std::string& data_override;  // --data-dir ("" : $KVEVICT_DATA or ../shared/data)
};

class Command {
 public:
  virtual ~Command() = default;
  virtual bool parsed() const = 0;
  virtual int run(const std::string& data_override) = 0;
};

using Commands = std::vector<std::unique_ptr<Command>>;

template <typename Args>
class BoundCommand final : public Command {
 public:
  using AddFlags = void (*)(CLI::App& command, Args& args);
  using Body = int (*)(Args& args, const Invocation& invocation);
  BoundCommand(CLI::App& app, const std::string& name, const std::string& help, AddFlags add_flags, Body body)
      : command_(app.add_subcommand(name, help)), body_(body) {
    add_flags(*command_, args_);
  }
  bool parsed() const override { return command_->parsed(); }
  int run(const std::string& data_override) override { return body_(args_, Invocation{*command_, data_override}); }

 private:
  CLI::App* command_;
  Args args_;
  Body body_;
};

template <typename Args>
void add_command(Commands& commands, CLI::App& app, const std::string& name, const std::string& help,
                 typename BoundCommand<Args>::AddFlags add_flags, typename BoundCommand<Args>::Body body) {
  commands.push_back(std::make_unique<BoundCommand<Args>>(app, name, help, add_flags, body));
}

// generate, perplexity, bench, make-random-model (model_commands.cpp).
void add_model_commands(CLI::App& app, Commands& commands);
// eval, rouge, table, export (task_commands.cpp).
void add_task_commands(CLI::App& app, Commands& commands);
// sweep, merge, status (sweep_commands.cpp).
void add_sweep_commands(CLI::App& app, Commands& commands);
// analyze (analyze_command.cpp).
void add_analyze_command(CLI::App& app, Commands& commands);
// serve (serve_command.cpp).
void add_serve_command(CLI::App& app, Commands& commands);

}  // namespace kvevict
