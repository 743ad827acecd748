// A sweep's output folder: its layout, which cells a shard runs, which cells are
// finished (and the repair a resume does after a kill), and the checks that a folder
// holds this sweep before anything is written into it. The local sweep, the merge and
// the Slurm submission and status all read folders through this one module.
//
// Layout of a local sweep (or one shard) in DIR:
//   config.json        the sweep config, the shard and its cells (the record)
//   results.csv        one row per (cell, metric), appended durably
//   predictions/       per-cell JSONL when the config asks for predictions
// A Slurm sweep in DIR adds:
//   slurm/sweep.json   what was submitted (config, shard count, job ids)
//   slurm/sweep.sbatch, slurm/merge.sbatch    the array and merge scripts
//   slurm/shard-I-JOB.log, slurm/merge-JOB.log
//   shards/I/          shard I, laid out as a local sweep
//   config.json, results.csv  written by the merge job
#pragma once
#include <set>
#include <string>
#include <vector>

#include "harness/config/sweep_grid.h"

namespace kvevict {

// Shard `index` of `count` runs the cells i with i % count == index: the one shard rule.
struct Shard {
  int index = 0, count = 1;
  bool holds(size_t cell) const { return static_cast<int>(cell % static_cast<size_t>(count)) == index; }
};
// "i/N" (0 <= i < N), as --shard gives it.
Shard shard_from_text(const std::string& text);
// The cells `shard` runs, in plan order.
std::vector<const SweepCell*> shard_cells(const SweepPlan& plan, Shard shard);

struct SweepFolder {
  std::string dir;  // as given for a local sweep; absolute for a Slurm one (see absolute_folder)

  std::string record() const;       // DIR/config.json
  std::string results_csv() const;  // DIR/results.csv
  std::string predictions_dir() const;
  std::string slurm_dir() const;
  std::string slurm_record() const;  // DIR/slurm/sweep.json
  std::string array_script() const;
  std::string merge_script() const;
  std::string shards_dir() const;
  std::string shard_dir(int shard) const;
  std::string shard_log(int shard, const std::string& array_job) const;
  std::string merge_log(const std::string& job) const;
};
// The folder at `dir`, absolute and normalised without a trailing slash (Slurm runs the
// scripts from elsewhere).
SweepFolder absolute_folder(const std::string& dir);

// Keys of the cells of `plan` whose metric rows are all in `csv`. With `repair` (a
// resume, under the folder's lock) a torn last line is cut off and the rows of a cell
// that has only some of its metrics are removed, so that the cell is redone whole; the
// rewrite replaces the file at once. Without it (status, while a shard may be writing)
// the file is only read and a torn last line is ignored.
std::set<std::string> finished_cells(const std::string& csv, const SweepPlan& plan, bool repair);

// A local sweep's folder (locked by the caller): refuses one that holds another sweep or
// shard, or results without a record; then writes this sweep's record.
void claim_folder_for_shard(const SweepFolder& folder, const SweepPlan& plan, Shard shard);

// A Slurm sweep's folder: refuses one whose submission record, merged results or shard
// folders belong to another sweep config or another split, before anything is written.
void check_folder_holds_split(const SweepFolder& folder, const nlohmann::json& config, int shards);

}  // namespace kvevict
