// A Slurm sweep folder's state as `kvevict status` and --resubmit-failed read it:
// slurm/sweep.json (read_slurm_record), the sweep it records expanded, each shard's
// cells counted and the resubmit command built. squeue and sacct are off PATH, as on a
// machine without Slurm, so nothing is run.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/sweep/slurm_status.h"

namespace {
// As fuzz_sweep_config: a grid the config's author made large is slow, not a finding.
constexpr double kMaxCells = 20000;
double grid_bound(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("config") || !record["config"].is_object()) return 1;
  double cells = 1;
  for (const auto& [key, value] : record["config"].items())
    if (value.is_array() && !value.empty()) cells *= static_cast<double>(value.size());
  return cells;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool no_slurm = [] { return ::setenv("PATH", "/nonexistent-bin", 1) == 0; }();
  (void)no_slurm;
  static const std::string dir = [] {
    const auto folder = std::filesystem::path(kvevict::fuzz::scratch_file("unused", nullptr, 0)).parent_path() / "slurm_run";
    std::filesystem::create_directories(folder / "slurm");
    return folder.string();
  }();
  {
    std::ofstream out(dir + "/slurm/sweep.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const kvevict::SweepFolder folder = kvevict::absolute_folder(dir);
    if (grid_bound(kvevict::read_slurm_record(folder).raw) > kMaxCells) return 0;
    const kvevict::SweepStatus status = kvevict::read_sweep_status(folder, "/nonexistent-data", 5);
    status.failed();
    kvevict::resubmit_command(status);
  } catch (const kvevict::Error&) {
  }
  return 0;
}
