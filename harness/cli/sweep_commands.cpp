// sweep (local or --slurm), merge and status: their flags, and what they print (the
// work is in harness/sweep/).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/sweep/slurm.h"
#include "harness/sweep/slurm_scripts.h"
#include "harness/sweep/slurm_status.h"
#include "harness/sweep/sweep.h"

namespace kvevict {
namespace {

struct SweepArgs {
  std::string config, out, shard, model;
  int limit = -2;     // -2: as the config says
  bool wait = false;  // wait for another process's lock on --out instead of failing
  bool slurm = false;
  int shards = 0, max_parallel = 0;  // into slurm_request when given
  SlurmRequest slurm_request;
};

// The flags that only mean something with --slurm.
std::vector<std::string> slurm_only_flags() {
  std::vector<std::string> flags = {"--shards", "--max-parallel"};
  for (const auto& o : sbatch_options()) flags.push_back(std::string("--") + o.option);
  for (const char* flag : {"--dry-run", "--sbatch", "--resubmit-failed"}) flags.push_back(flag);
  return flags;
}

void add_sweep_flags(CLI::App& app, SweepArgs& args) {
  app.add_option("config", args.config, "sweep config JSON (see configs/)")->required();
  app.add_option("--out", args.out, "output folder (results.csv, config.json, predictions/)")->required();
  app.add_option("--shard", args.shard, "run shard i of N (\"i/N\", 0 <= i < N)");
  app.add_option("--model", args.model, "replace the config's models with this one");
  app.add_option("--limit", args.limit, "replace the config's per-task document limit (-1: all)");
  app.add_flag("--wait", args.wait, "if another process is writing to --out, wait for it instead of failing");
  SlurmRequest& r = args.slurm_request;
  app.add_flag("--slurm", args.slurm, "submit the sweep as a Slurm job array plus a merge job, then exit");
  app.add_option("--shards", args.shards,
                 "--slurm: array tasks (default: the folder's split, else the config's slurm.shards, else min(cells, 10); "
                 "at most " + std::to_string(kMaxSlurmShards) + ")")
      ->check(cli::at_least(1));
  app.add_option("--max-parallel", args.max_parallel, "--slurm: at most K array tasks at once (--array=...%K)")
      ->check(cli::at_least(1));
  for (const auto& o : sbatch_options())
    app.add_option(std::string("--") + o.option, r.sbatch[o.key], std::string("--slurm: ") + o.help)
        ->type_name(o.count ? "INT" : "TEXT");
  app.add_flag("--dry-run", r.dry_run, "--slurm: write DIR/slurm/*.sbatch and print the sbatch commands, submit nothing");
  app.add_option("--sbatch", r.sbatch_program, "--slurm: the sbatch program (default: sbatch on PATH)");
  app.add_flag("--resubmit-failed", r.resubmit_failed, "--slurm: resubmit only the shards `kvevict status` reports failed");
}

// Progress on stderr: a live line on a terminal, plain lines otherwise.
class StderrReporter : public SweepReporter {
 public:
  StderrReporter() : tty_(isatty(STDERR_FILENO)) {}
  void planned(size_t cells, size_t in_shard, size_t done, const std::vector<std::string>& skipped) override {
    std::cerr << "sweep " << cells << " cells, this shard " << in_shard << ", already done " << done << ", to run "
              << in_shard - done << std::endl;
    for (const auto& note : skipped) std::cerr << "skipped " << note << std::endl;
  }
  void waiting_for_lock(const std::string& message) override { std::cerr << message << std::endl; }
  void cell_started(size_t index, size_t count, const std::string& label) override {
    prefix_ = "[" + std::to_string(index) + "/" + std::to_string(count) + "] " + label;
    started_ = last_print_ = std::chrono::steady_clock::now();
    if (!tty_) std::cerr << prefix_ << std::endl;
  }
  void examples(int done, int total) override {
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - started_).count();
    const double rate = elapsed > 0 ? done / elapsed : 0;
    const double eta = rate > 0 ? (total - done) / rate : 0;
    std::ostringstream line;
    line << prefix_ << "  examples " << done << "/" << total << "  " << std::fixed << std::setprecision(1) << rate
         << "/s  ETA " << static_cast<int>(eta) << "s";
    if (tty_) {
      std::cerr << "\r\033[K" << line.str() << std::flush;
    } else if (done == total || std::chrono::duration<double>(now - last_print_).count() > 10) {
      std::cerr << line.str() << std::endl;
      last_print_ = now;
    }
  }
  void cell_finished() override {
    if (tty_) std::cerr << std::endl;
  }
  void cell_failed(const std::string& label, const std::string& error) override {
    std::cerr << "cell failed: " << label << ": " << error << std::endl;
  }

 private:
  bool tty_;
  std::string prefix_;
  std::chrono::steady_clock::time_point started_, last_print_;
};

// "sbatch --parsable X": a command as the user would type it.
std::string shown(const std::vector<std::string>& argv) {
  std::string text;
  for (size_t i = 0; i < argv.size(); ++i) text += (i ? " " + argv[i] : std::filesystem::path(argv[i]).filename().string());
  return text;
}

int print_submission(const SlurmSubmission& s) {
  if (s.shards.empty()) {
    std::cout << "no failed shards to resubmit in " << s.folder.dir << " (kvevict status " << s.folder.dir << ")\n";
  } else if (s.dry_run) {
    std::cout << "wrote " << s.folder.array_script() << " and " << s.folder.merge_script()
              << " (dry run: nothing submitted)\n"
              << shown(s.array_command) << "\n"
              << shown(s.merge_command) << "\n";
  } else {
    std::cout << "submitted array job " << s.array_job << " (shards " << s.array_spec << " of " << s.shard_count
              << ") and merge job " << s.merge_job << " (after it succeeds)\n"
              << "logs: " << s.folder.slurm_dir() << "/\n"
              << "follow with: kvevict status " << s.folder.dir << "\n";
  }
  return 0;
}

int run_sweep_command(SweepArgs& args, const Invocation& at) {
  const SweepSource source{args.config, args.model, args.limit == -2 ? std::nullopt : std::optional<int>(args.limit)};
  if (args.slurm) {
    if (!args.shard.empty()) throw Error("--shard and --slurm do not go together: --slurm makes the shards (--shards N)");
    if (at.command.count("--shards")) args.slurm_request.shards = args.shards;
    if (at.command.count("--max-parallel")) args.slurm_request.max_parallel = args.max_parallel;
    return print_submission(submit_slurm_sweep(source, args.out, args.slurm_request, at.data_override));
  }
  for (const auto& flag : slurm_only_flags())
    if (at.command.count(flag)) throw Error(flag + " needs --slurm");
  const Shard shard = args.shard.empty() ? Shard{} : shard_from_text(args.shard);
  StderrReporter reporter;
  const SweepOutcome outcome = run_sweep(source, args.out, shard, args.wait, at.data_override, reporter);
  if (outcome.failed)
    throw Error(std::to_string(outcome.failed) + " of " + std::to_string(outcome.ran) +
                " cells failed (see above); finished cells are in " + outcome.results_csv);
  std::cerr << "sweep done: " << outcome.results_csv << std::endl;
  return 0;
}

struct MergeArgs {
  std::vector<std::string> dirs;
  std::string out;
  bool wait = false;
};

void add_merge_flags(CLI::App& cmd, MergeArgs& args) {
  cmd.add_option("dirs", args.dirs, "shard folders")->required();
  cmd.add_option("--out", args.out, "merged folder")->required();
  cmd.add_flag("--wait", args.wait, "if another process is writing to --out, wait for it instead of failing");
}

int run_merge_command(MergeArgs& args, const Invocation&) {
  StderrReporter reporter;
  const MergeOutcome outcome = run_merge(args.dirs, args.out, args.wait, reporter);
  if (outcome.shards_found != outcome.shard_count)
    std::cerr << "warning: merged " << outcome.shards_found << " of " << outcome.shard_count << " shards" << std::endl;
  std::cerr << "merged " << outcome.rows << " rows into " << outcome.results_csv << std::endl;
  return 0;
}

struct StatusArgs {
  std::string dir;
  int log_lines = 10;
};

void add_status_flags(CLI::App& cmd, StatusArgs& args) {
  cmd.add_option("dir", args.dir, "the --out folder of `kvevict sweep --slurm`")->required();
  cmd.add_option("--log-lines", args.log_lines, "log lines shown per failed shard (0: none)")
      ->check(cli::at_least(0))
      ->capture_default_str();
}

int run_status_command(StatusArgs& args, const Invocation& at) {
  const SweepFolder folder = absolute_folder(args.dir);
  if (!std::filesystem::is_directory(folder.dir)) throw Error(args.dir + ": no such folder");
  const SweepStatus s = read_sweep_status(folder, data_dir(at.data_override), static_cast<size_t>(args.log_lines));
  std::cout << "sweep " << folder.dir << ": " << s.plan.cells.size() << " cells in " << s.shards << " shards (config "
            << s.record.value("config_path", std::string("?")) << ")\n";
  if (!s.slurm_queryable)
    std::cout << "(squeue is not on PATH or did not answer: states come from the shard folders and logs)\n";
  for (const auto& st : s.shard_status) {
    std::cout << "shard " << st.index << ": " << st.done << "/" << st.total << " cells  " << shard_kind_name(st.kind);
    if (!st.job.empty()) {
      std::cout << "  (Slurm " << st.job;
      if (!st.slurm.state.empty()) std::cout << " " << st.slurm.state;
      if (!st.slurm.reason.empty() && st.slurm.reason != "None") std::cout << ", " << st.slurm.reason;
      if (st.exit_code) std::cout << ", exit " << *st.exit_code;
      std::cout << ")";
    }
    if (!st.detail.empty()) std::cout << "  " << st.detail;
    std::cout << "\n";
  }
  std::cout << "merge: ";
  if (!s.merge_job.empty()) {
    std::cout << "job " << s.merge_job;
    if (!s.merge_state.state.empty()) std::cout << " " << s.merge_state.state;
    if (!s.merge_state.reason.empty() && s.merge_state.reason != "None") std::cout << " (" << s.merge_state.reason << ")";
    std::cout << "; ";
  }
  if (s.merged_rows) std::cout << folder.results_csv() << " written (" << *s.merged_rows << " rows)\n";
  else std::cout << "results.csv not written yet\n";
  const std::vector<int> failed = s.failed();
  std::cout << "failed shards: ";
  if (failed.empty()) std::cout << "none\n";
  for (size_t i = 0; i < failed.size(); ++i) std::cout << failed[i] << (i + 1 < failed.size() ? " " : "\n");
  for (const auto& st : s.shard_status) {
    if (st.kind != ShardStatus::kFailed) continue;
    if (st.log.empty()) {
      std::cout << "--- shard " << st.index << ": no log (" << folder.slurm_dir() << "/shard-" << st.index << "-*.log)\n";
      continue;
    }
    std::cout << "--- shard " << st.index << ", last lines of " << st.log << ":\n";
    for (const auto& line : st.log_tail) std::cout << "  " << line << "\n";
  }
  if (!failed.empty()) std::cout << "resubmit only the failed shards with:\n  " << resubmit_command(s) << "\n";
  return 0;
}

}  // namespace

void add_sweep_commands(CLI::App& app, Commands& commands) {
  add_command<SweepArgs>(commands, app, "sweep",
                         "run a grid of models x tasks x policies x budgets x ... into a results CSV", add_sweep_flags,
                         run_sweep_command);
  add_command<StatusArgs>(commands, app, "status",
                          "a Slurm sweep folder: cells done per shard, Slurm states, failed shards and how to resubmit them",
                          add_status_flags, run_status_command);
  add_command<MergeArgs>(commands, app, "merge", "combine shard output folders into one", add_merge_flags,
                         run_merge_command);
}

}  // namespace kvevict
