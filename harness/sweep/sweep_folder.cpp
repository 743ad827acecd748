#include "harness/sweep/sweep_folder.h"

#include <cstdlib>
#include <filesystem>
#include <map>

#include "harness/common/atomic_file.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/kill_points.h"
#include "harness/sweep/slurm_status.h"
#include "notebooks-export/results_csv.h"
#include "tasks/task.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

Shard shard_from_text(const std::string& text) {
  const auto [index, count] = parse_shard(text);
  return {index, count};
}

std::vector<const SweepCell*> shard_cells(const SweepPlan& plan, Shard shard) {
  std::vector<const SweepCell*> cells;
  for (size_t i = 0; i < plan.cells.size(); ++i)
    if (shard.holds(i)) cells.push_back(&plan.cells[i]);
  return cells;
}

namespace {
std::string under(const std::string& dir, const std::string& relative) { return (fs::path(dir) / relative).string(); }
}  // namespace

std::string SweepFolder::record() const { return under(dir, "config.json"); }
std::string SweepFolder::results_csv() const { return under(dir, "results.csv"); }
std::string SweepFolder::predictions_dir() const { return under(dir, "predictions"); }
std::string SweepFolder::slurm_dir() const { return under(dir, "slurm"); }
std::string SweepFolder::slurm_record() const { return under(dir, "slurm/sweep.json"); }
std::string SweepFolder::array_script() const { return under(dir, "slurm/sweep.sbatch"); }
std::string SweepFolder::merge_script() const { return under(dir, "slurm/merge.sbatch"); }
std::string SweepFolder::shards_dir() const { return under(dir, "shards"); }
std::string SweepFolder::shard_dir(int shard) const { return under(dir, "shards/" + std::to_string(shard)); }
std::string SweepFolder::shard_log(int shard, const std::string& array_job) const {
  return under(dir, "slurm/shard-" + std::to_string(shard) + "-" + array_job + ".log");
}
std::string SweepFolder::merge_log(const std::string& job) const { return under(dir, "slurm/merge-" + job + ".log"); }

SweepFolder absolute_folder(const std::string& dir) {
  SweepFolder folder{fs::absolute(dir).lexically_normal().string()};
  if (folder.dir.size() > 1 && folder.dir.back() == '/') folder.dir.pop_back();
  return folder;
}

std::set<std::string> finished_cells(const std::string& csv, const SweepPlan& plan, bool repair) {
  std::set<std::string> finished;
  if (!fs::exists(csv)) return finished;
  const auto rows = read_results_csv(csv, repair);
  std::map<std::string, size_t> metrics_of_task, expected, present;
  for (const auto& cell : plan.cells) {
    auto [known, added] = metrics_of_task.try_emplace(cell.eval.task, 0);
    if (added) known->second = make_task(cell.eval.task)->metric_names().size();
    expected[cell.key()] = known->second;
  }
  for (const auto& row : rows) present[row_cell_key(row)]++;
  for (const auto& [key, count] : expected)
    if (present[key] >= count) finished.insert(key);
  if (!repair) return finished;
  // A kill tears at most the one write() of a cell: its rows are either all there or
  // some of them, never mixed with another cell's.
  std::vector<ResultRow> kept;
  for (const auto& row : rows) {
    const auto key = row_cell_key(row);
    if (expected.count(key) && !finished.count(key)) continue;
    kept.push_back(row);
  }
  if (kept.size() != rows.size()) {
    if (kept.empty()) {  // only a partial cell was there: an empty results file, header alone
      write_file_atomically(csv, result_header() + "\n");
      return finished;
    }
    const std::string tmp = temporary_path_beside(csv);
    fs::remove(tmp);
    append_rows_durably(tmp, kept);
    kill_point("rewrite-before-publish");
    publish_file(tmp, csv);
  }
  return finished;
}

void claim_folder_for_shard(const SweepFolder& folder, const SweepPlan& plan, Shard shard) {
  const std::string csv = folder.results_csv(), record_path = folder.record();
  if (fs::exists(csv) && !fs::is_regular_file(csv)) throw Error(csv + ": is not a regular file");
  if (fs::exists(csv) && !fs::exists(record_path))
    throw Error(folder.dir + ": holds results.csv but no config.json, so its sweep is unknown; use another --out");
  json record = {{"config", plan.config}, {"shard", {shard.index, shard.count}}, {"cells", json::array()}};
  for (const SweepCell* cell : shard_cells(plan, shard)) record["cells"].push_back(cell->key());
  if (fs::exists(record_path)) {
    const json previous = read_json_file(record_path);
    if (previous["config"] != record["config"] || previous["shard"] != record["shard"])
      throw Error(record_path + ": this folder holds a different sweep config or shard; use another --out");
  }
  write_file_atomically(record_path, record.dump(2) + "\n");
}

namespace {

// A folder's or a shard's sweep.json value at key, or one line naming the file and the key.
const json& record_value(const json& record, const std::string& path, const char* key) {
  if (!record.is_object() || !record.contains(key))
    throw Error(path + ": not a kvevict sweep record (no \"" + key + "\")");
  return record.at(key);
}

}  // namespace

void check_folder_holds_split(const SweepFolder& folder, const json& config, int shards) {
  const std::string different = ": this folder holds a different sweep config's results; use another --out";
  if (fs::exists(folder.slurm_record())) {
    const SlurmRecord record = read_slurm_record(folder);  // strict: the same reader as status
    if (record.raw["config"] != config) throw Error(folder.slurm_record() + different);
    if (record.shards != shards)
      throw Error(folder.slurm_record() + ": this sweep was split into " + std::to_string(record.shards) +
                  " shards; keep --shards " + std::to_string(record.shards) + " or use another --out");
  }
  if (fs::exists(folder.record())) {
    const json record = read_json_file(folder.record());
    if (record_value(record, folder.record(), "config") != config) throw Error(folder.record() + different);
    if (!record.contains("merged_from"))
      throw Error(folder.record() + ": this folder holds an unsharded run of this sweep; use another --out");
  }
  if (!fs::is_directory(folder.shards_dir())) return;
  for (const auto& entry : fs::directory_iterator(folder.shards_dir())) {
    const SweepFolder shard{entry.path().string()};
    if (!fs::exists(shard.record())) continue;
    const json record = read_json_file(shard.record());
    if (record_value(record, shard.record(), "config") != config) throw Error(shard.record() + different);
    const json& held = record_value(record, shard.record(), "shard");
    const std::string name = entry.path().filename().string();
    if (held != json::array({std::atoi(name.c_str()), shards}) || name != std::to_string(held[0].get<int>()))
      throw Error(shard.record() + ": holds shard " + held.dump() + ", not part of a " + std::to_string(shards) +
                  "-shard split of this folder; use another --out");
  }
}

}  // namespace kvevict
