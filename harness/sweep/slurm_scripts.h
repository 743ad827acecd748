// The Slurm side of a sweep, as text: the sbatch options (command line over the config's
// "slurm" block over defaults), the job array script (one task per shard, each running
// `kvevict sweep --shard i/N`, which resumes) and the merge script. Nothing here runs
// Slurm; slurm.h submits, slurm_status.h reads back.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/config/sweep_grid.h"
#include "harness/sweep/sweep_folder.h"

namespace kvevict {

// The sbatch options a sweep passes through, each settable by the config's "slurm"
// block and by the flag --OPTION: the one list of them.
struct SbatchOption {
  const char* key;     // in the config's "slurm" block
  const char* option;  // sbatch's long option; also kvevict's flag
  const char* help;
  bool count;     // a whole number >= 1
  bool in_merge;  // also set on the merge job (which needs no GPU, memory or many CPUs)
};
const std::vector<SbatchOption>& sbatch_options();

// The most shards (array tasks) a sweep may have: far above a useful split, far below
// what would make `kvevict status` look at every shard for minutes (Slurm's own
// MaxArraySize defaults to 1001).
constexpr int kMaxSlurmShards = 10000;

// What the command line asks of a Slurm sweep. Absent: from the folder's split, the
// config's "slurm" block, or the default.
struct SlurmRequest {
  std::optional<int> shards, max_parallel;
  std::map<std::string, std::string> sbatch;  // SbatchOption::key -> value as given
  std::string sbatch_program;                 // empty: sbatch on PATH
  bool dry_run = false, resubmit_failed = false;
};

struct SlurmOptions {
  int shards = 0;
  int max_parallel = 0;                                     // 0: no limit
  std::vector<std::pair<std::string, std::string>> sbatch;  // sbatch option -> value, in table order
};
// The options of a sweep of `cell_count` cells; errors name the flag or the config key.
SlurmOptions resolve_slurm_options(const SlurmRequest& request, const nlohmann::json& raw_config,
                                   const std::string& config_path, size_t cell_count);

// How each array task and the merge job call kvevict: this binary, the data folder and
// the config as absolute paths, and the --model/--limit overrides as given.
struct KvevictCall {
  std::string kvevict, config_path, data_dir;
  std::vector<std::string> sweep_overrides;
};

// "0-2", "0,3,5": the --array list of shard indices, with "%K" when K limits it.
std::string array_spec(const std::vector<int>& shards, int max_parallel);
// Writes DIR/slurm/sweep.sbatch and DIR/slurm/merge.sbatch.
void write_slurm_scripts(const SweepFolder& folder, const KvevictCall& call, const SlurmOptions& options,
                         const nlohmann::json& raw_config, const std::string& config_path, const SweepPlan& plan);

// A word for a shell: single-quoted, with ' written as '\''.
std::string shell_quote(const std::string& text);

}  // namespace kvevict
