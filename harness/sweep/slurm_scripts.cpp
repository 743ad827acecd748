#include "harness/sweep/slurm_scripts.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "harness/common/atomic_file.h"
#include "harness/common/config_reader.h"
#include "harness/common/errors.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<SbatchOption>& sbatch_options() {
  static const std::vector<SbatchOption> options = {
      // key            option           help                                                count  in_merge
      {"partition", "partition", "sbatch --partition", false, true},
      {"account", "account", "sbatch --account", false, true},
      {"time", "time", "sbatch --time per shard (e.g. 4:00:00)", false, true},
      {"cpus_per_task", "cpus-per-task", "sbatch --cpus-per-task", true, false},
      {"mem", "mem", "sbatch --mem (e.g. 32G)", false, false},
      {"gres", "gres", "sbatch --gres (e.g. gpu:1)", false, false},
  };
  return options;
}

namespace {

const int kDefaultMaxShards = 10;

// #SBATCH values are parsed by sbatch, not a shell; a narrow character set keeps a
// config from smuggling extra directives or lines into the script.
std::string checked_value(const std::string& what, const std::string& value, bool count) {
  if (value.empty()) throw Error(what + " is empty");
  for (char c : value)
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::string("_.:,=/@+-").find(c) == std::string::npos)
      throw Error(what + " \"" + value + "\": Slurm option values may only hold letters, digits and _.:,=/@+-");
  if (count && (value.find_first_not_of("0123456789") != std::string::npos || value.find_first_not_of('0') == std::string::npos))
    throw Error(what + " " + value + ": must be at least 1");
  return value;
}

std::string job_name(const json& raw_config, const std::string& config_path) {
  std::string name = fs::path(config_path).stem().string();
  if (raw_config.contains("name") && raw_config["name"].is_string()) name = raw_config["name"].get<std::string>();
  for (auto& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return "kvevict-" + name;
}

// The merge's table: one row per task and per setting that varies across the cells, one
// column per policy, so every (row, policy) has exactly one value per metric.
std::string table_row_key(const SweepPlan& plan) {
  std::map<std::string, std::set<std::string>> values;
  for (const auto& cell : plan.cells)
    for (const auto& [column, value] : cell_identity(cell)) values[column].insert(value);
  const auto figure = result_columns(SettingUse::figure), line = result_columns(SettingUse::line);
  std::vector<std::string> key = figure;
  for (const auto& column : result_columns(ColumnRole::setting))
    if (!std::count(figure.begin(), figure.end(), column) && !std::count(line.begin(), line.end(), column) &&
        values[column].size() > 1)
      key.push_back(column);
  // A shared-context sweep's rows per turn (the turn column is empty in every other row).
  const bool turns = std::any_of(plan.cells.begin(), plan.cells.end(),
                                 [](const SweepCell& cell) { return cell.eval.task_options.turns > 0; });
  for (const auto& column : result_columns(ColumnRole::metric))
    if (column != "turn" || turns) key.push_back(column);
  std::string text;
  for (const auto& column : key) text += (text.empty() ? "" : ",") + column;
  return text;
}

std::string table_column_key() {
  std::string text;
  for (const auto& column : result_columns(SettingUse::line)) text += (text.empty() ? "" : ",") + column;
  return text;
}

std::string kvevict_prefix(const KvevictCall& call) {
  std::string command = shell_quote(call.kvevict);
  if (!call.data_dir.empty()) command += " --data-dir " + shell_quote(call.data_dir);
  return command;
}

std::string shard_command(const KvevictCall& call, const SweepFolder& folder, int shards) {
  std::string command = kvevict_prefix(call) + " sweep " + shell_quote(call.config_path) + " --out " +
                        shell_quote(folder.shards_dir()) + "/\"$shard\" --shard \"$shard/" + std::to_string(shards) + "\"";
  for (const auto& o : call.sweep_overrides) command += " " + shell_quote(o);
  return command;
}

}  // namespace

SlurmOptions resolve_slurm_options(const SlurmRequest& request, const json& raw_config, const std::string& config_path,
                                   size_t cell_count) {
  std::vector<std::string> keys = {"shards", "max_parallel"};
  for (const auto& o : sbatch_options()) keys.push_back(o.key);
  static const json empty = json::object();
  const ConfigObject block(raw_config.contains("slurm") ? raw_config["slurm"] : empty, config_path, keys, "slurm.");
  constexpr long long kMost = std::numeric_limits<int>::max();
  // A count from its flag (absent: not given), else from the config's slurm block.
  auto count = [&](std::optional<int> flag_value, const std::string& flag, const std::string& key, int fallback,
                   long long most) {
    if (!flag_value) return block.integer(key, fallback, 1, most);
    if (*flag_value < 1 || *flag_value > most)
      throw Error(flag + " " + std::to_string(*flag_value) + ": must be in [1, " + std::to_string(most) + "]");
    return *flag_value;
  };
  SlurmOptions options;
  options.shards = count(request.shards, "--shards", "shards", static_cast<int>(std::min<size_t>(cell_count, kDefaultMaxShards)),
                         kMaxSlurmShards);
  if (static_cast<size_t>(options.shards) > cell_count)
    throw Error("--shards " + std::to_string(options.shards) + " is more than the sweep's " +
                std::to_string(cell_count) + " cells");
  options.max_parallel = count(request.max_parallel, "--max-parallel", "max_parallel", 0, kMost);
  for (const auto& o : sbatch_options()) {
    const auto given = request.sbatch.find(o.key);
    if (given != request.sbatch.end() && !given->second.empty()) {
      options.sbatch.push_back({o.option, checked_value(std::string("--") + o.option, given->second, o.count)});
    } else if (block.has(o.key)) {
      const json& v = block.raw(o.key);
      if (!v.is_string() && !v.is_number_integer()) throw Error(block.name(o.key) + " must be a string");
      options.sbatch.push_back(
          {o.option, checked_value(block.name(o.key), v.is_string() ? v.get<std::string>() : v.dump(), o.count)});
    }
  }
  return options;
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string array_spec(const std::vector<int>& shards, int max_parallel) {
  std::string spec;
  bool contiguous = shards.size() > 1;
  for (size_t i = 1; i < shards.size(); ++i) contiguous = contiguous && shards[i] == shards[i - 1] + 1;
  if (contiguous) {
    spec = std::to_string(shards.front()) + "-" + std::to_string(shards.back());
  } else {
    for (size_t i = 0; i < shards.size(); ++i) spec += (i ? "," : "") + std::to_string(shards[i]);
  }
  if (max_parallel > 0) spec += "%" + std::to_string(max_parallel);
  return spec;
}

void write_slurm_scripts(const SweepFolder& folder, const KvevictCall& call, const SlurmOptions& options,
                         const json& raw_config, const std::string& config_path, const SweepPlan& plan) {
  const std::string name = job_name(raw_config, config_path);
  std::vector<int> all(options.shards);
  for (int i = 0; i < options.shards; ++i) all[i] = i;
  std::ostringstream array;
  array << "#!/bin/bash\n"
        << "# kvevict sweep as a Slurm job array, one task per shard (written by `kvevict sweep --slurm`).\n"
        << "# A task resumes its shard folder: rerunning it computes only the cells missing there.\n"
        << "#SBATCH --job-name=" << name << "\n"
        << "#SBATCH --array=" << array_spec(all, options.max_parallel) << "\n"
        << "#SBATCH --output=" << folder.slurm_dir() << "/shard-%a-%A.log\n";
  for (const auto& [option, value] : options.sbatch) array << "#SBATCH --" << option << "=" << value << "\n";
  array << "shard=${SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is a job array}\n"
        << "echo \"kvevict shard $shard/" << options.shards
        << ": array job ${SLURM_ARRAY_JOB_ID:-?} task $shard on $(hostname -s)\"\n"
        << shard_command(call, folder, options.shards) << "\n"
        << "status=$?\n"
        << "echo \"kvevict shard exit: $status\"\n"
        << "exit $status\n";
  write_file_atomically(folder.array_script(), array.str());

  std::ostringstream merge;
  merge << "#!/bin/bash\n"
        << "# Merges the shard folders into results.csv and table.{md,csv} once every shard succeeded\n"
        << "# (submitted with --dependency=afterok on the array; written by `kvevict sweep --slurm`).\n"
        << "#SBATCH --job-name=" << name << "-merge\n"
        << "#SBATCH --output=" << folder.slurm_dir() << "/merge-%j.log\n"
        << "#SBATCH --kill-on-invalid-dep=yes\n";
  for (const auto& [option, value] : options.sbatch)
    for (const auto& o : sbatch_options())
      if (option == o.option && o.in_merge) merge << "#SBATCH --" << option << "=" << value << "\n";
  merge << "set -euo pipefail\n" << kvevict_prefix(call) << " merge";
  for (int i = 0; i < options.shards; ++i) merge << " " << shell_quote(folder.shard_dir(i));
  merge << " --out " << shell_quote(folder.dir) << "\n"
        << shell_quote(call.kvevict) << " table " << shell_quote(folder.dir) << " --rows " << table_row_key(plan)
        << " --cols " << table_column_key() << "\n";
  write_file_atomically(folder.merge_script(), merge.str());
}

}  // namespace kvevict
