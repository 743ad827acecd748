// Where a Slurm sweep stands, as data for `kvevict status` to print and for
// --resubmit-failed to act on: cells done per shard (from the shard folders, read only),
// each shard's latest array task and its log, and the job states when squeue and sacct
// answer. Nothing here prints.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/config/sweep_grid.h"
#include "harness/sweep/sweep_folder.h"

namespace kvevict {

// slurm/sweep.json, read strictly: every value `status` and a resubmission act on is
// checked before any work (the shard count bounds the work, job ids go to squeue).
struct SlurmSubmissionRecord {
  std::string array_job, merge_job;  // digits only; empty: not submitted
  std::vector<int> shards;           // each in [0, shards)
  std::vector<std::pair<std::string, std::string>> sbatch_options;  // known sbatch options only
};
struct SlurmRecord {
  nlohmann::json raw;
  int shards = 0;  // in [1, kMaxSlurmShards]
  std::vector<SlurmSubmissionRecord> submissions;
};
// Throws kvevict::Error naming the file and the key at fault.
SlurmRecord read_slurm_record(const SweepFolder& folder);

struct JobState {
  std::string state, reason;  // squeue's %T and %r, or sacct's State; empty: Slurm did not say
};

struct ShardStatus {
  enum Kind { kNotSubmitted, kActive, kDone, kFailed, kUnknown };
  int index = 0, done = 0, total = 0;  // cells
  Kind kind = kUnknown;
  std::string job;  // "123_4": the latest array task that ran this shard
  JobState slurm;
  std::string log;  // empty: none written
  std::optional<int> exit_code;  // as the log's last "kvevict shard exit:" line says
  std::string detail;            // why a shard counts as failed or unknown, when not obvious
  std::vector<std::string> log_tail;  // a failed shard's last log lines (read_sweep_status's log_lines)
};
// "done", "FAILED", "queued/running", ...
const char* shard_kind_name(ShardStatus::Kind kind);

struct SweepStatus {
  SweepFolder folder;
  nlohmann::json record;  // slurm/sweep.json
  SweepPlan plan;
  int shards = 0;
  std::vector<ShardStatus> shard_status;
  std::string merge_job;
  JobState merge_state;
  bool slurm_queryable = false;       // squeue answered every query
  std::optional<size_t> merged_rows;  // rows of DIR/results.csv once the merge wrote it
  std::vector<int> failed() const;    // indices of the failed shards
};

// Throws kvevict::Error when `dir` is not a Slurm sweep folder. A failed shard's status
// holds the last `log_lines` lines of its log.
SweepStatus read_sweep_status(const SweepFolder& folder, const std::string& data_dir, size_t log_lines = 0);

// The command line that resubmits only the failed shards, with the options of the last submission.
std::string resubmit_command(const SweepStatus& status);

}  // namespace kvevict
