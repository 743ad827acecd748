// Sweep config: reading, checking and grid expansion (harness/config/sweep_grid.h), as
// `kvevict sweep`, `merge` and the Slurm driver call it, then every cell's identity.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/config/sweep_grid.h"

namespace {
// A grid's size is the product of its list lengths, which the config's author chooses:
// 300 seeds x 300 budgets is a legitimately slow config, not a finding. Inputs whose
// grid could exceed this many cells are skipped.
constexpr double kMaxCells = 20000;

double grid_bound(const nlohmann::json& config) {
  double cells = 1;
  for (const auto& [key, value] : config.items())
    if (value.is_array() && !value.empty()) cells *= static_cast<double>(value.size());
  return cells;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json config;
  try {  // as `kvevict sweep` reads it: parse_json, which refuses a key given twice
    config = kvevict::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "sweep.json");
  } catch (const kvevict::Error&) {
    return 0;
  }
  if (config.is_object() && grid_bound(config) > kMaxCells) return 0;
  try {
    const kvevict::SweepPlan plan = kvevict::expand_sweep(config, "sweep.json", "/nonexistent-data");
    for (const auto& cell : plan.cells) {
      const std::string key = cell.key();
      kvevict::cell_identity(cell);
      kvevict::format_row(kvevict::identity_row(cell.model, cell.eval));
      (void)key;
    }
  } catch (const kvevict::Error&) {
  }
  return 0;
}
