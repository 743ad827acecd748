// Slurm as the engine of a sweep: `kvevict sweep CONFIG --out DIR --slurm` writes a job
// array script (one task per shard, each running `kvevict sweep --shard i/N`, which
// resumes) and a merge script (slurm_scripts.h), submits both (the merge with
// --dependency=afterok on the array) and exits. `kvevict status DIR` reads the shard
// folders, the logs and, when they answer, squeue/sacct (slurm_status.h);
// --resubmit-failed reruns only the failed shards. The folder's layout is in sweep_folder.h.
#pragma once
#include <string>
#include <vector>

#include "harness/sweep/slurm_scripts.h"
#include "harness/sweep/sweep.h"

namespace kvevict {

// What was submitted, for the caller to report.
struct SlurmSubmission {
  SweepFolder folder;
  bool dry_run = false;
  std::vector<std::string> array_command, merge_command;  // as run; a dry run's merge waits on ARRAY_JOB_ID
  std::vector<int> shards;  // submitted now; empty: no failed shard to resubmit
  int shard_count = 0;
  std::string array_spec;   // e.g. "0-2" or "1,4"
  std::string array_job, merge_job;  // empty for a dry run
};

// Writes the scripts into `out`, records the submission in DIR/slurm/sweep.json and
// submits; throws kvevict::Error naming the flag, key or file at fault before anything
// is written, and when sbatch refuses.
SlurmSubmission submit_slurm_sweep(const SweepSource& source, const std::string& out, const SlurmRequest& request,
                                   const std::string& data_override);

}  // namespace kvevict
