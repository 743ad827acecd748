// Slurm as the engine of a sweep: `kvevict sweep CONFIG --out DIR --slurm` writes a job
// array script (one task per shard, each running `kvevict sweep --shard i/N`, which
// resumes) and a merge script, submits both (the merge with --dependency=afterok on the
// array) and exits. `kvevict status DIR` reads the shard folders, the logs and, when
// they answer, squeue/sacct; `--resubmit-failed` reruns only the failed shards.
//
// Layout of DIR:
//   slurm/sweep.json            what was submitted (config, shard count, job ids)
//   slurm/sweep.sbatch          the array script; slurm/merge.sbatch the merge script
//   slurm/shard-I-JOB.log       one log per array task; slurm/merge-JOB.log
//   shards/I/                   shard I's results.csv and config.json
//   results.csv, config.json, table.md, table.csv   written by the merge job
#pragma once
#include <string>

#include "harness/sweep/sweep.h"

namespace kvevict {

struct SlurmArgs {
  bool slurm = false, dry_run = false, resubmit_failed = false;
  int shards = -1, max_parallel = -1, cpus_per_task = -1;  // -1: from the config's "slurm" block
  std::string partition, account, time, mem, gres;
  std::string sbatch;  // the sbatch binary; empty: "sbatch" on PATH
};

// `kvevict sweep`: the local sweep, or with --slurm the submission. Slurm-only flags
// without --slurm are refused.
int run_sweep_command(const SweepArgs& sweep, const SlurmArgs& slurm, const std::string& data_override);

// `kvevict status DIR`: cells done per shard, Slurm states, failed shards and how to
// resubmit them.
struct StatusArgs {
  std::string dir;
  int log_lines = 10;
};
int run_status(const StatusArgs& args, const std::string& data_override);

}  // namespace kvevict
