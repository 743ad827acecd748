#include "harness/sweep/sweep.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <type_traits>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"
#include "harness/eval/h2o_adaptor.h"
#include "harness/eval/result_rows.h"
#include "harness/common/folder_lock.h"
#include "harness/common/kill_points.h"
#include "policies/option_checks.h"
#include "policies/registry.h"

namespace kvevict {
namespace fs = std::filesystem;


namespace {

// Progress on stderr: a live line on a terminal, plain lines otherwise.
class ProgressReporter {
 public:
  ProgressReporter(int total_cells) : total_(total_cells), tty_(isatty(STDERR_FILENO)) {}
  void start_cell(int index, const std::string& label) {
    index_ = index;
    label_ = label;
    started_ = std::chrono::steady_clock::now();
    last_print_ = started_;
    if (!tty_) std::cerr << "[" << index_ << "/" << total_ << "] " << label_ << std::endl;
  }
  void examples(int done, int total) {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - started_).count();
    double rate = elapsed > 0 ? done / elapsed : 0;
    double eta = rate > 0 ? (total - done) / rate : 0;
    std::ostringstream line;
    line << "[" << index_ << "/" << total_ << "] " << label_ << "  examples " << done << "/" << total << "  "
         << std::fixed << std::setprecision(1) << rate << "/s  ETA " << static_cast<int>(eta) << "s";
    if (tty_) {
      std::cerr << "\r\033[K" << line.str() << std::flush;
    } else if (done == total || std::chrono::duration<double>(now - last_print_).count() > 10) {
      std::cerr << line.str() << std::endl;
      last_print_ = now;
    }
  }
  void end_cell() {
    if (tty_) std::cerr << std::endl;
  }

 private:
  int total_, index_ = 0;
  bool tty_;
  std::string label_;
  std::chrono::steady_clock::time_point started_, last_print_;
};

std::string cell_label(const SweepCell& cell) {
  const auto row = identity_row(cell.model, cell.eval);
  auto f = row.fields();
  std::string label = "task=" + f["task"] + " policy=" + f["policy"];
  if (!f["budget"].empty()) label += " budget=" + f["budget"];
  if (!f["budget_tokens"].empty()) label += " budget_tokens=" + f["budget_tokens"];
  if (!f["heavy_share"].empty()) label += " heavy_share=" + f["heavy_share"];
  label += " protocol=" + f["protocol"] + " pipeline=" + f["pipeline"] + " shots=" + f["shots"] + " seed=" + f["seed"];
  return label;
}

std::string resolve_model(const std::string& model, const std::string& data_override) {
  if (fs::path(model).is_absolute() || fs::exists(model)) return model;
  return data_path(model, data_override);
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  write_file_atomically(path, j.dump(2) + "\n");  // checked: a failed write is an error
}

// Cells whose rows are all in results.csv. A kill can tear the one write() of a cell:
// the torn line is cut off (read_results_csv's repair) and a cell left with only some
// of its metric rows is removed, so it is redone whole.
std::set<std::string> finished_cells(const std::string& csv, const SweepPlan& plan) {
  std::set<std::string> finished;
  if (!fs::exists(csv)) return finished;
  auto rows = read_results_csv(csv, /*repair=*/true);
  std::map<std::string, size_t> expected, present;
  for (const auto& cell : plan.cells) expected[cell.key()] = make_task(cell.eval.task)->metric_names().size();
  for (const auto& row : rows) present[row_cell_key(row)]++;
  std::vector<ResultRow> kept;
  for (const auto& row : rows) {
    const auto key = row_cell_key(row);
    if (expected.count(key) && present[key] < expected[key]) continue;
    kept.push_back(row);
    finished.insert(key);
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

// A ratio budget that keeps 0 tokens even on a request of its model's whole context
// would run every document with an empty cache: refused before the output folder is
// touched. The models are loaded here (the cells reuse them); one that fails to load is
// left for its cells to report.
void refuse_budgets_that_keep_nothing(const SweepPlan& plan, int shard_index, int shard_count,
                                      const std::string& config_path, const std::string& data_override,
                                      const ModelOptions& model_options,
                                      std::map<std::string, std::unique_ptr<Model>>& models) {
  std::set<std::string> failed;
  for (size_t i = 0; i < plan.cells.size(); ++i) {
    if (static_cast<int>(i % shard_count) != shard_index) continue;
    const SweepCell& cell = plan.cells[i];
    auto& model = models[cell.model];
    if (!model && !failed.count(cell.model)) {
      try {
        model = Model::load(resolve_model(cell.model, data_override), model_options);
      } catch (const Error&) {
        failed.insert(cell.model);
      }
    }
    if (!model) continue;
    check_budget_keeps_a_token(*make_policy(cell.eval.policy, cell.eval.policy_options), model->arch().max_positions,
                               config_path + ": key \"budgets\" (model " + cell.model + "):");
  }
}

}  // namespace

int run_sweep(const SweepArgs& args, const std::string& data_override) {
  nlohmann::json config = read_json_file(args.config);
  if (!args.model.empty()) config["models"] = nlohmann::json::array({args.model});
  if (args.limit != -2) config["limit"] = args.limit;
  SweepPlan plan = expand_sweep(config, args.config, data_dir(data_override));
  int shard_index = 0, shard_count = 1;
  if (!args.shard.empty()) std::tie(shard_index, shard_count) = parse_shard(args.shard);
  ModelOptions model_options;  // "device": "cuda" runs the sweep on a GPU (e.g. a Slurm GPU partition)
  for (const char* key : {"device", "dtype"})
    if (config.contains(key) && !config[key].is_string()) throw Error(args.config + ": key \"" + key + "\" must be a string");
  model_options.device = config.value("device", model_options.device);
  model_options.dtype = config.value("dtype", model_options.dtype);
  parse_dtype(model_options.dtype);  // a bad name fails before anything is written
  std::map<std::string, std::unique_ptr<Model>> models;  // loaded once per process
  refuse_budgets_that_keep_nothing(plan, shard_index, shard_count, args.config, data_override, model_options, models);

  // The output folder is checked and locked before any cell runs or anything is rewritten.
  if (fs::exists(args.out) && !fs::is_directory(args.out))
    throw Error("--out " + args.out + ": is a file, not a folder");
  fs::create_directories(args.out);
  FolderLock lock(args.out, args.wait);
  const std::string config_path = (fs::path(args.out) / "config.json").string();
  const std::string csv = (fs::path(args.out) / "results.csv").string();
  if (fs::exists(csv) && !fs::is_regular_file(csv)) throw Error(csv + ": is not a regular file");
  if (fs::exists(csv) && !fs::exists(config_path))
    throw Error(args.out + ": holds results.csv but no config.json, so its sweep is unknown; use another --out");
  nlohmann::json record = {{"config", plan.config}, {"shard", {shard_index, shard_count}}, {"cells", nlohmann::json::array()}};
  for (size_t i = 0; i < plan.cells.size(); ++i)
    if (static_cast<int>(i % shard_count) == shard_index) record["cells"].push_back(plan.cells[i].key());
  if (fs::exists(config_path)) {
    auto previous = read_json_file(config_path);
    if (previous["config"] != record["config"] || previous["shard"] != record["shard"])
      throw Error(config_path + ": this folder holds a different sweep config or shard; use another --out");
  }
  write_json_file(config_path, record);

  std::set<std::string> finished = finished_cells(csv, plan);

  std::vector<const SweepCell*> todo;
  int mine = 0;
  for (size_t i = 0; i < plan.cells.size(); ++i) {
    if (static_cast<int>(i % shard_count) != shard_index) continue;
    ++mine;
    if (!finished.count(plan.cells[i].key())) todo.push_back(&plan.cells[i]);
  }
  std::cerr << "sweep " << plan.cells.size() << " cells, this shard " << mine << ", already done "
            << mine - todo.size() << ", to run " << todo.size() << std::endl;

  const bool predictions = config.value("predictions", false);
  if (predictions) fs::create_directories(fs::path(args.out) / "predictions");
  std::map<std::string, std::optional<EvalResult>> full_runs;
  for (const auto& note : plan.skipped) std::cerr << "skipped " << note << std::endl;
  ProgressReporter progress(static_cast<int>(todo.size()));
  int index = 0, failed = 0;
  for (const SweepCell* cell : todo) {
   try {
    progress.start_cell(++index, cell_label(*cell));
    auto& model = models[cell->model];
    if (!model) model = Model::load(resolve_model(cell->model, data_override), model_options);
    // Full-cache reference runs are shared by every policy cell with the same task settings.
    std::string full_key = cell->model + "|" + cell->eval.task + "|" + std::to_string(cell->eval.task_options.shots) +
                           "|" + std::to_string(cell->eval.task_options.seed) + "|" + score_mode_name(cell->eval.score) +
                           "|" + protocol_name(cell->eval.protocol) + "|" + pipeline_name(cell->eval.task_options.pipeline);
    EvalResult result = evaluate(*model, cell->eval, [&](int d, int t) { progress.examples(d, t); }, &full_runs[full_key]);
    if (is_reference_policy(cell->eval.policy) && !full_runs[full_key]) full_runs[full_key] = result;
    progress.end_cell();
    if (predictions)
      write_predictions(result, cell->eval,
                        (fs::path(args.out) / "predictions" / (file_name_part(cell->key()) + ".jsonl")).string());
    append_rows_durably(csv, eval_rows(cell->model, cell->eval, result));
   } catch (const Error& e) {
    // One bad cell does not stop the grid; it is reported and the exit code says so.
    progress.end_cell();
    std::cerr << "cell failed: " << cell_label(*cell) << ": " << e.what() << std::endl;
    ++failed;
   }
  }
  if (failed) throw Error(std::to_string(failed) + " of " + std::to_string(todo.size()) +
                          " cells failed (see above); finished cells are in " + csv);
  std::cerr << "sweep done: " << csv << std::endl;
  return 0;
}

int run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait) {
  if (dirs.empty()) throw Error("merge needs at least one folder");
  nlohmann::json config;
  std::set<int> shards_seen;
  int shard_count = -1;
  std::vector<ResultRow> rows;
  std::set<std::string> seen;
  for (const auto& dir : dirs) {
    const std::string path = (fs::path(dir) / "config.json").string();
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
    for (auto& row : read_results_csv((fs::path(dir) / "results.csv").string())) {
      std::string key = row_cell_key(row) + row.metric;
      if (seen.insert(key).second) rows.push_back(row);
    }
  }
  if (static_cast<int>(shards_seen.size()) != shard_count)
    std::cerr << "warning: merged " << shards_seen.size() << " of " << shard_count << " shards" << std::endl;
  if (fs::exists(out) && !fs::is_directory(out)) throw Error("--out " + out + ": is a file, not a folder");
  fs::create_directories(out);
  FolderLock lock(out, wait);
  const std::string csv = (fs::path(out) / "results.csv").string();
  const std::string out_config = (fs::path(out) / "config.json").string();
  // A folder this same sweep was merged into before is merged again (shards may have grown).
  const bool remerge = fs::exists(out_config) && read_json_file(out_config).contains("merged_from") &&
                       read_json_file(out_config)["config"] == config;
  if (fs::exists(csv) && !remerge) throw Error(csv + ": already exists; merge into an empty folder");
  // Rows keep the unsharded run's cell order.
  SweepPlan plan = expand_sweep(config, "merged config", "");
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < plan.cells.size(); ++i) order[plan.cells[i].key()] = i;
  std::stable_sort(rows.begin(), rows.end(), [&](const ResultRow& a, const ResultRow& b) {
    return order[row_cell_key(a)] < order[row_cell_key(b)];
  });
  // The record first: a merge killed between the two writes leaves a folder that the same
  // merge, run again, recognises as its own and completes (results.csv first left one it
  // refused as "already exists").
  nlohmann::json record = {{"config", config}, {"shard", {0, 1}}, {"merged_from", dirs}, {"cells", nlohmann::json::array()}};
  for (const auto& c : plan.cells) record["cells"].push_back(c.key());
  write_json_file(out_config, record);
  // Written beside and renamed over, so a reader never sees a half-merged file.
  if (!rows.empty()) {
    const std::string temporary = temporary_path_beside(csv);
    fs::remove(temporary);
    append_rows_durably(temporary, rows);
    publish_file(temporary, csv);
  }
  std::cerr << "merged " << rows.size() << " rows into " << csv << std::endl;
  return 0;
}

}  // namespace kvevict
