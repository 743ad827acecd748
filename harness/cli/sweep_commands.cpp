// sweep (local or --slurm), merge and status: their flags (bodies in harness/sweep/).
#include "harness/cli/command.h"
#include "harness/sweep/slurm.h"
#include "harness/sweep/sweep.h"

namespace kvevict {
namespace {

struct SweepCommandArgs {
  SweepArgs sweep;
  SlurmArgs slurm;
};

void add_sweep_flags(CLI::App& app, SweepCommandArgs& both) {
  SweepArgs& args = both.sweep;
  app.add_option("config", args.config, "sweep config JSON (see configs/)")->required();
  app.add_option("--out", args.out, "output folder (results.csv, config.json, predictions/)")->required();
  app.add_option("--shard", args.shard, "run shard i of N (\"i/N\", 0 <= i < N)");
  app.add_option("--model", args.model, "replace the config's models with this one");
  app.add_option("--limit", args.limit, "replace the config's per-task document limit (-1: all)");
  app.add_flag("--wait", args.wait, "if another process is writing to --out, wait for it instead of failing");
  SlurmArgs& a = both.slurm;
  app.add_flag("--slurm", a.slurm, "submit the sweep as a Slurm job array plus a merge job, then exit");
  app.add_option("--shards", a.shards, "--slurm: array tasks (default: the folder's split, else the config's slurm.shards, else min(cells, 10))");
  app.add_option("--max-parallel", a.max_parallel, "--slurm: at most K array tasks at once (--array=...%K)");
  app.add_option("--partition", a.partition, "--slurm: sbatch --partition");
  app.add_option("--account", a.account, "--slurm: sbatch --account");
  app.add_option("--time", a.time, "--slurm: sbatch --time per shard (e.g. 4:00:00)");
  app.add_option("--cpus-per-task", a.cpus_per_task, "--slurm: sbatch --cpus-per-task");
  app.add_option("--mem", a.mem, "--slurm: sbatch --mem (e.g. 32G)");
  app.add_option("--gres", a.gres, "--slurm: sbatch --gres (e.g. gpu:1)");
  app.add_flag("--dry-run", a.dry_run, "--slurm: write DIR/slurm/*.sbatch and print the sbatch commands, submit nothing");
  app.add_option("--sbatch", a.sbatch, "--slurm: the sbatch program (default: sbatch on PATH)");
  app.add_flag("--resubmit-failed", a.resubmit_failed, "--slurm: resubmit only the shards `kvevict status` reports failed");
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

void add_status_flags(CLI::App& cmd, StatusArgs& args) {
  cmd.add_option("dir", args.dir, "the --out folder of `kvevict sweep --slurm`")->required();
  cmd.add_option("--log-lines", args.log_lines, "log lines shown per failed shard")->capture_default_str();
}

}  // namespace

void add_sweep_commands(CLI::App& app, Commands& commands) {
  add_command<SweepCommandArgs>(
      commands, app, "sweep", "run a grid of models x tasks x policies x budgets x ... into a results CSV",
      add_sweep_flags,
      [](SweepCommandArgs& a, const Invocation& at) { return run_sweep_command(a.sweep, a.slurm, at.data_override); });
  add_command<StatusArgs>(
      commands, app, "status",
      "a Slurm sweep folder: cells done per shard, Slurm states, failed shards and how to resubmit them",
      add_status_flags, [](StatusArgs& a, const Invocation& at) { return run_status(a, at.data_override); });
  add_command<MergeArgs>(commands, app, "merge", "combine shard output folders into one", add_merge_flags,
                         [](MergeArgs& a, const Invocation&) { return run_merge(a.dirs, a.out, a.wait); });
}

}  // namespace kvevict
