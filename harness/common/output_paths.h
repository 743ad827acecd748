// Where a command may write: every output file and folder given on the command line is
// checked before any work starts (an hour of eval must not end in "cannot write"). No
// output replaces one of the command's own inputs or lies in a folder it reads (a
// model's, the data folder), and no command writes onto a sweep folder's own files (its
// results.csv, config.json, lock, Slurm state, shard and prediction folders), which only
// the sweep and merge write. Paths are compared after symbolic links are resolved, and
// files by device and inode, so a link or a second name of an input is caught too.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace kvevict {

// A folder that a sweep, a shard or a merge wrote: it holds results.csv, .kvevict.lock
// or slurm/sweep.json.
bool is_sweep_folder(const std::string& dir);

// What a command reads, so that the output checks can refuse an output that would
// replace it. Inputs that do not exist are skipped (reading them fails later anyway).
class CommandInputs {
 public:
  // A file the command reads; `what` names it in an error ("--text-file", "the sweep config").
  CommandInputs& file(const std::string& path, const std::string& what);
  // A folder it reads (a model's, the data folder): nothing may be written inside it, and
  // its files are protected wherever an output's symbolic link points.
  CommandInputs& folder(const std::string& path, const std::string& what);

  // Why writing `path` (an output file or folder) would touch an input, or "".
  std::string conflict(const std::string& path) const;

 private:
  struct Input {
    dev_t device;
    ino_t inode;
    bool is_folder;
    std::string description;  // "--model m", "--model m's config.json"
  };
  void add(const std::string& path, bool is_folder, const std::string& description);
  std::vector<Input> inputs_;
};

// kvevict::Error "FLAG PATH: ..." unless `path` can be written as a new or replaced file:
// not a folder, its folder exists and is writable, not one of `inputs` nor inside one of
// their folders, and not one of a sweep folder's own files (nor anything under its
// slurm/, shards/ or predictions/). `kvevict serve --port-file` takes this one call.
void check_output_file(const std::string& path, const std::string& flag, const CommandInputs& inputs = {});

// The same for a folder a command writes files into (created when missing): not a file,
// its nearest existing ancestor writable, not an input nor inside an input folder, not a
// sweep folder's slurm/, shards/ or predictions/ folder (nor inside one); and each of
// `file_names` (what the command writes there, when the names are known) checked in it
// as check_output_file checks a file.
void check_output_folder(const std::string& dir, const std::string& flag, const CommandInputs& inputs = {},
                         const std::vector<std::string>& file_names = {});

// The output folder of `sweep` and `merge`, which write a sweep folder's own files and so
// may be one (or a shard folder under a Slurm sweep's shards/): not a file, its nearest
// existing ancestor writable, and neither it nor its results.csv or config.json one of
// `inputs` or inside one of their folders.
void check_sweep_output_folder(const std::string& dir, const std::string& flag, const CommandInputs& inputs);

}  // namespace kvevict
