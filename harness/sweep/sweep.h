// The sweep driver: expands a grid (models x tasks x policies x budgets x heavy
// shares x protocols x shots x seeds) into cells, runs each cell once, and appends
// its metric rows to DIR/results.csv durably, so a rerun resumes and a kill loses no
// finished cell. Shards split the cells deterministically; merge joins shard folders.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/eval/evaluator.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {

struct SweepArgs {
  std::string config, out, shard, model;
  int limit = -2;  // -2: as the config says
  bool wait = false;  // wait for another process's lock on --out instead of failing
};

// One cell of the grid.
struct SweepCell {
  std::string model;  // as written in the config (resolved when run)
  EvalConfig eval;
  std::string key() const;  // identity of the cell in results.csv
};

struct SweepPlan {
  nlohmann::json config;         // the config as given (with overrides applied)
  std::vector<SweepCell> cells;  // in a fixed order
  std::vector<std::string> skipped;  // combinations that cannot run, and why
};

// Expands a sweep config; throws kvevict::Error naming the config file and key.
SweepPlan expand_sweep(const nlohmann::json& config, const std::string& config_path,
                       const std::string& data_dir);

// Parses "i/N" (0 <= i < N).
std::pair<int, int> parse_shard(const std::string& text);

// The identity of the cell a row belongs to (same as SweepCell::key()).
std::string row_cell_key(const ResultRow& row);
// The cell's identity columns as results.csv writes them (outcome columns empty).
std::map<std::string, std::string> cell_identity(const SweepCell& cell);

int run_sweep(const SweepArgs& args, const std::string& data_override);
int run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait = false);


}  // namespace kvevict
