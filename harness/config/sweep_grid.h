// A sweep config read, checked and expanded into its grid of cells (models x tasks x
// policies x budgets x heavy shares x protocols x shots x seeds), and each cell's
// identity in results.csv. No LibTorch: the sweep driver (harness/sweep/) runs the cells,
// and fuzz/fuzz_sweep_config.cpp feeds this reader arbitrary configs.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/config/eval_config.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {

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
  std::string device = "cpu";        // the config's "device": "cuda" runs the cells on a GPU
  std::string dtype = "float32";     // the config's "dtype", a known name
};

// Expands a sweep config; throws kvevict::Error naming the config file and key.
SweepPlan expand_sweep(const nlohmann::json& config, const std::string& config_path,
                       const std::string& data_dir);

// The keys a sweep config may hold (any other is refused).
const std::vector<std::string>& sweep_config_keys();

// Parses "i/N" (0 <= i < N).
std::pair<int, int> parse_shard(const std::string& text);

// The identity of the cell a row belongs to (same as SweepCell::key()).
std::string row_cell_key(const ResultRow& row);
// "task=copa policy=h2o budget=0.2 ...": the cell in one line (progress, failures),
// its label columns (label_columns()) that apply to it.
std::string cell_label(const SweepCell& cell);
// The cell's identity columns as results.csv writes them (outcome columns empty).
std::map<std::string, std::string> cell_identity(const SweepCell& cell);

}  // namespace kvevict
