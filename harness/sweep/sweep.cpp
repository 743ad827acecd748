#include "harness/sweep/sweep.h"

#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/folder_lock.h"
#include "harness/common/text.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/result_rows.h"
#include "policies/registry.h"

namespace kvevict {
namespace fs = std::filesystem;

SweepPlan plan_sweep(const SweepSource& source, const std::string& data_dir) {
  nlohmann::json config = read_json_file(source.config_path);
  if (!source.model.empty()) config["models"] = nlohmann::json::array({source.model});
  if (source.limit) config["limit"] = *source.limit;
  return expand_sweep(config, source.config_path, data_dir);
}

namespace {

std::string resolve_model(const std::string& model, const std::string& data_override) {
  if (fs::path(model).is_absolute() || fs::exists(model)) return model;
  return data_path(model, data_override);
}

// The models of a sweep, each loaded once per process (the cells share them), with the
// threads set for the one about to run.
class ModelCache {
 public:
  ModelCache(const SweepPlan& plan, const std::string& data_override) : data_override_(data_override) {
    options_.device = plan.device;  // "cuda" runs the sweep on a GPU (e.g. a Slurm GPU partition)
    options_.dtype = plan.dtype;
  }
  // Null when the model does not load (remembered; the error is rethrown by `get`).
  const Model* try_get(const std::string& name) {
    if (!failed_.count(name)) try {
        return &get(name);
      } catch (const Error&) {
        failed_.insert(name);
      }
    return nullptr;
  }
  const Model& get(const std::string& name) {
    auto& model = models_[name];
    if (!model) model = Model::load(resolve_model(name, data_override_), options_);
    use_threads_for(*model, options_.threads);
    return *model;
  }

 private:
  std::string data_override_;
  ModelOptions options_;
  std::map<std::string, std::unique_ptr<Model>> models_;
  std::set<std::string> failed_;
};

// Cells that cannot run on their model (a ratio or byte budget that keeps 0 tokens even on
// a request of the model's whole context, a KIVI group that does not divide head_dim, a
// length past the context, ...) are refused, naming the cell, before the output folder
// is touched and before any cell runs. A model that fails to load is left for its cells
// to report.
void refuse_cells_the_model_cannot_run(const std::vector<const SweepCell*>& cells, const std::string& config_path,
                                       ModelCache& models) {
  for (const SweepCell* cell : cells)
    if (const Model* model = models.try_get(cell->model)) {
      try {
        check_eval_for_model(*model, cell->eval, "\"lengths\"");
      } catch (const Error& e) {
        throw Error(config_path + " (model " + cell->model + "): cell " + cell_label(*cell) + ": " + e.what());
      }
    }
}

// Cells that differ only in their policy share one full-cache reference run.
std::string reference_run_key(const SweepCell& cell) {
  const auto& e = cell.eval;
  return cell.model + "|" + e.task + "|" + std::to_string(e.task_options.shots) + "|" +
         std::to_string(e.task_options.seed) + "|" + score_mode_name(e.score) + "|" + protocol_name(e.protocol) + "|" +
         pipeline_name(e.task_options.pipeline);
}

}  // namespace

CommandInputs sweep_inputs(const SweepSource& source, const SweepPlan& plan, const std::string& data_override) {
  CommandInputs inputs;
  inputs.file(source.config_path, "the sweep config").folder(data_dir(data_override), "the data folder");
  std::set<std::string> models;
  for (const SweepCell& cell : plan.cells)
    if (models.insert(cell.model).second) inputs.folder(resolve_model(cell.model, data_override), "the model");
  return inputs;
}

SweepOutcome run_sweep(const SweepSource& source, const std::string& out, Shard shard, bool wait,
                       const std::string& data_override, SweepReporter& reporter) {
  const SweepPlan plan = plan_sweep(source, data_dir(data_override));
  const std::vector<const SweepCell*> mine = shard_cells(plan, shard);
  ModelCache models(plan, data_override);
  refuse_cells_the_model_cannot_run(mine, source.config_path, models);

  // The output folder is checked and locked before any cell runs or anything is rewritten.
  check_sweep_output_folder(out, "--out", sweep_inputs(source, plan, data_override));
  fs::create_directories(out);
  const SweepFolder folder{out};
  FolderLock lock(out, wait, [&](const std::string& message) { reporter.waiting_for_lock(message); });
  claim_folder_for_shard(folder, plan, shard);
  const std::set<std::string> finished = finished_cells(folder.results_csv(), plan, /*repair=*/true);

  std::vector<const SweepCell*> todo;
  for (const SweepCell* cell : mine)
    if (!finished.count(cell->key())) todo.push_back(cell);
  reporter.planned(plan.cells.size(), mine.size(), mine.size() - todo.size(), plan.skipped);

  const bool predictions = plan.config.value("predictions", false);
  if (predictions) fs::create_directories(folder.predictions_dir());
  std::map<std::string, std::optional<EvalResult>> reference_runs;
  SweepOutcome outcome;
  outcome.results_csv = folder.results_csv();
  for (const SweepCell* cell : todo) {
    const std::string label = cell_label(*cell);
    reporter.cell_started(++outcome.ran, todo.size(), label);
    try {
      const Model& model = models.get(cell->model);
      auto& reference = reference_runs[reference_run_key(*cell)];
      EvalResult result = evaluate(model, cell->eval, [&](int d, int t) { reporter.examples(d, t); }, &reference);
      if (is_reference_policy(cell->eval.policy) && !reference) reference = result;
      reporter.cell_finished();
      if (predictions)
        write_predictions(result, cell->eval,
                          (fs::path(folder.predictions_dir()) / (file_name_part(cell->key()) + ".jsonl")).string());
      append_rows_durably(folder.results_csv(), eval_rows(cell->model, cell->eval, result));
    } catch (const Error& e) {
      // One bad cell does not stop the grid; it is reported and the outcome counts it.
      reporter.cell_finished();
      reporter.cell_failed(label, e.what());
      ++outcome.failed;
    }
  }
  return outcome;
}

MergeOutcome run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait,
                       SweepReporter& reporter) {
  if (dirs.empty()) throw Error("merge needs at least one folder");
  nlohmann::json config;
  std::set<int> shards_seen;
  int shard_count = -1;
  std::vector<ResultRow> rows;
  std::set<std::string> seen;
  for (const auto& dir : dirs) {
    const SweepFolder shard{dir};
    const std::string path = shard.record();
    auto record = read_json_file(path);
    if (config.is_null()) config = record["config"];
    else if (record["config"] != config)
      throw Error(path + ": its sweep config differs from " + dirs[0] + "'s; refusing to merge");
    if (!record.contains("shard") || !record["shard"].is_array() || record["shard"].size() != 2)
      throw Error(path + ": not a shard record (no \"shard\": [index, count])");
    const int count = static_cast<int>(json_int(record["shard"][1], path, "shard", 1, std::numeric_limits<int>::max()));
    if (shard_count >= 0 && count != shard_count)
      throw Error(path + ": shard count " + std::to_string(count) + " differs from " + std::to_string(shard_count));
    shard_count = count;
    if (!shards_seen.insert(static_cast<int>(json_int(record["shard"][0], path, "shard", 0, count - 1))).second)
      throw Error(path + ": shard " + record["shard"][0].dump() + " appears twice");
    for (auto& row : read_results_csv(shard.results_csv())) {
      std::string key = row_cell_key(row) + row.metric;
      if (seen.insert(key).second) rows.push_back(row);
    }
  }
  CommandInputs shard_folders;
  for (const auto& dir : dirs) shard_folders.folder(dir, "the shard folder");
  check_sweep_output_folder(out, "--out", shard_folders);
  fs::create_directories(out);
  const SweepFolder merged{out};
  FolderLock lock(out, wait, [&](const std::string& message) { reporter.waiting_for_lock(message); });
  const std::string csv = merged.results_csv();
  // A folder this same sweep was merged into before is merged again (shards may have grown).
  const bool remerge = fs::exists(merged.record()) && read_json_file(merged.record()).contains("merged_from") &&
                       read_json_file(merged.record())["config"] == config;
  if (fs::exists(csv) && !remerge) throw Error(csv + ": already exists; merge into an empty folder");
  // Rows keep the unsharded run's cell order.
  SweepPlan plan = expand_sweep(config, "merged config", "");
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < plan.cells.size(); ++i) order[plan.cells[i].key()] = i;
  std::stable_sort(rows.begin(), rows.end(), [&](const ResultRow& a, const ResultRow& b) {
    return order[row_cell_key(a)] < order[row_cell_key(b)];
  });
  // The record first: a merge killed between the two writes leaves a folder that the same
  // merge, run again, recognises as its own and completes.
  nlohmann::json record = {{"config", config}, {"shard", {0, 1}}, {"merged_from", dirs}, {"cells", nlohmann::json::array()}};
  for (const auto& c : plan.cells) record["cells"].push_back(c.key());
  write_file_atomically(merged.record(), record.dump(2) + "\n");
  // Written beside and renamed over, so a reader never sees a half-merged file.
  if (!rows.empty()) {
    const std::string temporary = temporary_path_beside(csv);
    fs::remove(temporary);
    append_rows_durably(temporary, rows);
    publish_file(temporary, csv);
  }
  return {rows.size(), static_cast<int>(shards_seen.size()), shard_count, csv};
}

}  // namespace kvevict
