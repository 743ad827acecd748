// Where a command may write: every output file and folder given on the command line is
// checked before any work starts (an hour of eval must not end in "cannot write"), and
// no command writes onto a sweep folder's own files (its results.csv, config.json, lock,
// Slurm state, shard and prediction folders), which only the sweep and merge write.
#pragma once
#include <string>

namespace kvevict {

// A folder that a sweep, a shard or a merge wrote: it holds results.csv, .kvevict.lock
// or slurm/sweep.json.
bool is_sweep_folder(const std::string& dir);

// kvevict::Error "FLAG PATH: ..." unless `path` can be written as a new or replaced file:
// not a folder, its folder exists and is writable, and not one of a sweep folder's own
// files (nor anything under its slurm/, shards/ or predictions/).
void check_output_file(const std::string& path, const std::string& flag);

// The same for a folder a command writes files into (created when missing): not a file,
// its nearest existing ancestor writable, not a sweep folder's slurm/, shards/ or
// predictions/ folder (nor inside one).
void check_output_folder(const std::string& dir, const std::string& flag);

}  // namespace kvevict
