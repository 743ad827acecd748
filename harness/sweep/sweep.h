// The sweep driver: runs each cell of an expanded grid (harness/config/sweep_grid.h)
// once, and appends its metric rows to DIR/results.csv durably, so a rerun resumes and
// a kill loses no finished cell. Shards split the cells deterministically
// (sweep_folder.h); merge joins shard folders. Nothing here prints: the caller passes a
// SweepReporter and gets the outcome back.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/common/output_paths.h"
#include "harness/config/sweep_grid.h"
#include "harness/sweep/sweep_folder.h"

namespace kvevict {

// A sweep config file with the command line's overrides.
struct SweepSource {
  std::string config_path;
  std::string model;         // replaces the config's "models" when not empty
  std::optional<int> limit;  // replaces its "limit"
};
// The config read, overridden and expanded (errors name the file and key).
SweepPlan plan_sweep(const SweepSource& source, const std::string& data_dir);
// What a sweep reads (its config, the data folder, its models' folders), which its --out
// may neither be nor lie in (check_sweep_output_folder).
CommandInputs sweep_inputs(const SweepSource& source, const SweepPlan& plan, const std::string& data_override);

// What a running sweep tells its caller; every call is optional to handle.
class SweepReporter {
 public:
  virtual ~SweepReporter() = default;
  // Before the first cell: the grid's cells, this shard's, how many were already done,
  // and the combinations the grid skips (plan.skipped).
  virtual void planned(size_t cells, size_t in_shard, size_t done, const std::vector<std::string>& skipped) {}
  virtual void waiting_for_lock(const std::string& message) {}  // another process holds --out
  virtual void cell_started(size_t index, size_t count, const std::string& label) {}  // index from 1
  virtual void examples(int done, int total) {}
  virtual void cell_finished() {}
  virtual void cell_failed(const std::string& label, const std::string& error) {}
};

struct SweepOutcome {
  size_t ran = 0, failed = 0;  // cells run this time, and of them failed (the rest finished)
  std::string results_csv;
};

// Runs `shard` of the sweep into `out`. A cell that fails is reported and counted and the
// others go on; an error before any cell runs (bad config, a folder holding another
// sweep, a lock held without `wait`) throws kvevict::Error.
SweepOutcome run_sweep(const SweepSource& source, const std::string& out, Shard shard, bool wait,
                       const std::string& data_override, SweepReporter& reporter);

struct MergeOutcome {
  size_t rows = 0;
  int shards_found = 0, shard_count = 0;  // fewer found than counted: a partial merge
  std::string results_csv;
};
MergeOutcome run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait,
                       SweepReporter& reporter);

}  // namespace kvevict
