// The sweep driver: runs each cell of an expanded grid (harness/config/sweep_grid.h)
// once, and appends its metric rows to DIR/results.csv durably, so a rerun resumes and
// a kill loses no finished cell. Shards split the cells deterministically; merge joins shard folders.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/config/sweep_grid.h"
#include "harness/eval/evaluator.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {

struct SweepArgs {
  std::string config, out, shard, model;
  int limit = -2;  // -2: as the config says
  bool wait = false;  // wait for another process's lock on --out instead of failing
};

int run_sweep(const SweepArgs& args, const std::string& data_override);
int run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait = false);


}  // namespace kvevict
