#include "harness/sweep/kvpress_leaderboard.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "harness/common/atomic_file.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"
#include "harness/common/version.h"
#include "harness/sweep/sweep_folder.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tasks/long_context.h"
#include "tasks/task.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double round2(double x) { return std::round(x * 100.0) / 100.0; }

std::string two_decimals(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", x);
  return text;
}

// A YAML scalar: plain where YAML reads it back as the same string, else double-quoted
// with JSON's escapes (a YAML double-quoted string takes them).
std::string yaml_string(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/' || c == '+');
  if (plain && (s == "true" || s == "false" || s == "null" || s == "yes" || s == "no")) plain = false;
  if (plain && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '.' || s[0] == '+'))
    plain = false;
  return plain ? s : json(s).dump();
}

const char* const kColumns[] = {"index", "task", "context_length", "question", "answer", "predicted_answer"};

int64_t integer_cell(const std::string& text, const std::string& where) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(where + ": \"" + text + "\" is not a non-negative integer");
  return std::stoll(text);
}

}  // namespace

std::string leaderboard_run_folder(const LeaderboardRun& run) {
  std::string name = "ruler__" + std::to_string(run.length) + "__" + run.model + "__" + run.press_name + "__" +
                     two_decimals(run.compression_ratio);
  if (run.query_aware) name += "__query_aware";
  return file_name_part(name, "+");  // "ada+snapkv" as the policy is named
}

json leaderboard_metrics(const std::vector<LeaderboardPrediction>& predictions) {
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::vector<std::string>>>> by_task;
  for (const auto& p : predictions) {
    by_task[p.task].first.push_back(ruler_postprocess(p.predicted_answer));
    by_task[p.task].second.push_back(p.answer);
  }
  json metrics = json::object();
  double sum = 0;
  for (const auto& [task, items] : by_task) {
    const double score = string_match_all(items.first, items.second);
    metrics[task] = {{"string_match", score}};
    sum += score;
  }
  if (!by_task.empty()) metrics["average"] = {{"string_match", round2(sum / static_cast<double>(by_task.size()))}};
  return metrics;
}

std::string leaderboard_config_yaml(const LeaderboardRun& run) {
  std::ostringstream y;
  y << "dataset: ruler\n"
    << "data_dir: '" << run.length << "'\n"
    << "model: " << yaml_string(run.model) << "\n"
    << "device: cpu\n"
    << "press_name: " << yaml_string(run.press_name) << "\n"
    << "compression_ratio: " << two_decimals(run.compression_ratio) << "\n"
    << "fraction: 1.0\n"
    << "max_context_length: " << run.length << "\n"
    << "query_aware: " << (run.query_aware ? "true" : "false") << "\n"
    << "seed: " << run.seed << "\n"
    << "harness: kvevict\n"
    << "harness_version: " << yaml_string(run.version) << "\n"
    << "protocol: " << yaml_string(run.protocol) << "\n"
    << "mode: " << yaml_string(run.mode) << "\n"
    << "policy_options: " << yaml_string(run.policy_options) << "\n"
    << "items: " << run.predictions.size() << "\n";
  return y.str();
}

std::string leaderboard_predictions_csv(const std::vector<LeaderboardPrediction>& predictions) {
  std::string out;
  for (const char* column : kColumns) out += std::string(out.empty() ? "" : ",") + column;
  out += "\n";
  for (const auto& p : predictions) {
    out += std::to_string(p.index) + "," + csv_quote(p.task) + "," + std::to_string(p.context_length) + "," +
           csv_quote(p.question) + "," + csv_quote(json(p.answer).dump()) + "," + csv_quote(p.predicted_answer) + "\n";
  }
  return out;
}

std::vector<LeaderboardPrediction> read_leaderboard_predictions(const std::string& path) {
  const auto records = split_csv_records(read_text_file(path));
  if (records.empty()) throw Error(path + ": empty, expected a header line");
  const std::vector<std::string> header(std::begin(kColumns), std::end(kColumns));
  if (records[0].fields != header)
    throw Error(path + ":1: the header is not index,task,context_length,question,answer,predicted_answer");
  std::vector<LeaderboardPrediction> predictions;
  for (size_t r = 1; r < records.size(); ++r) {
    const std::string where = path + ":" + std::to_string(records[r].line);
    if (!records[r].problem.empty()) throw Error(where + ": " + records[r].problem);
    const auto& f = records[r].fields;
    if (f.size() != header.size())
      throw Error(where + ": " + std::to_string(f.size()) + " fields, expected " + std::to_string(header.size()));
    LeaderboardPrediction p;
    p.index = integer_cell(f[0], where + ": index");
    p.task = f[1];
    p.context_length = integer_cell(f[2], where + ": context_length");
    p.question = f[3];
    const json answer = parse_json(f[4], where + ": answer");
    if (!answer.is_array()) throw Error(where + ": answer must be a JSON list of strings");
    for (const auto& a : answer) {
      if (!a.is_string()) throw Error(where + ": answer must be a JSON list of strings");
      p.answer.push_back(a.get<std::string>());
    }
    p.predicted_answer = f[5];
    predictions.push_back(std::move(p));
  }
  return predictions;
}

std::string write_leaderboard_run(const LeaderboardRun& run, const std::string& parent) {
  const std::string dir = (fs::path(parent) / leaderboard_run_folder(run)).string();
  fs::create_directories(dir);
  write_file_atomically(dir + "/predictions.csv", leaderboard_predictions_csv(run.predictions));
  write_file_atomically(dir + "/metrics.json", leaderboard_metrics(run.predictions).dump(4) + "\n");
  write_file_atomically(dir + "/config.yaml", leaderboard_config_yaml(run));
  return dir;
}

namespace {

// Where a cell's predictions are: the folder's own, or a Slurm sweep's shards'.
std::string predictions_file(const SweepFolder& folder, const SweepCell& cell) {
  const std::string name = file_name_part(cell.key()) + ".jsonl";
  const fs::path own = fs::path(folder.predictions_dir()) / name;
  if (fs::exists(own)) return own.string();
  if (fs::is_directory(folder.shards_dir()))
    for (const auto& shard : fs::directory_iterator(folder.shards_dir())) {
      const fs::path in_shard = shard.path() / "predictions" / name;
      if (fs::exists(in_shard)) return in_shard.string();
    }
  return "";
}

std::vector<LeaderboardPrediction> read_cell_predictions(const std::string& path, const std::string& subtask) {
  std::vector<LeaderboardPrediction> out;
  std::istringstream in(read_text_file(path));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(n);
    const json j = parse_json(line, where);
    for (const char* key : {"id", "prompt_tokens", "question", "references", "prediction"})
      if (!j.contains(key))
        throw Error(where + ": no \"" + key + "\"" +
                    (std::string(key) == "question" ? " (written by an older kvevict: run the cell again)" : ""));
    LeaderboardPrediction p;
    p.index = integer_cell(j["id"].get<std::string>(), where + ": id");
    p.task = subtask;
    p.context_length = j["prompt_tokens"].get<int64_t>();
    p.question = j["question"].get<std::string>();
    p.answer = j["references"].get<std::vector<std::string>>();
    p.predicted_answer = j["prediction"].get<std::string>();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

std::vector<LeaderboardRun> leaderboard_runs(const std::string& sweep_dir, std::vector<std::string>* notes) {
  const SweepFolder folder{sweep_dir};
  const json record = read_json_file(folder.record());
  if (!record.contains("config")) throw Error(folder.record() + ": no \"config\": not a sweep folder's record");
  const SweepPlan plan = expand_sweep(record["config"], folder.record(), "");
  if (!plan.config.value("predictions", false))
    throw Error(folder.record() + ": the sweep kept no predictions (\"predictions\": true), which the leaderboard's "
                                  "predictions.csv needs");
  std::map<std::string, LeaderboardRun> runs;
  std::map<std::string, std::string> left_out;  // reason -> cells
  auto leave_out = [&](const SweepCell& cell, const std::string& why) { left_out[why] += " " + cell_label(cell); };
  for (const SweepCell& cell : plan.cells) {
    const EvalConfig& e = cell.eval;
    const std::string subtask = ruler_subtask_name(e.task);
    if (subtask.empty()) {
      leave_out(cell, "not a RULER task");
      continue;
    }
    if (e.protocol != Protocol::PrefillCompress) {
      leave_out(cell, "not under prefill-compress, the leaderboard's protocol");
      continue;
    }
    if (e.task_options.turns > 0) {
      leave_out(cell, "several questions per context (shared_contexts), which the leaderboard does not ask");
      continue;
    }
    const BudgetSpec& budget = e.policy_options.budget;
    const bool full = is_reference_policy(e.policy);
    if (!full && (budget.ratio <= 0 || e.policy_options.kv_quant.memory > 0)) {
      leave_out(cell, "a budget that is not a ratio of the length (the leaderboard's compression ratio)");
      continue;
    }
    auto identity = cell_identity(cell);
    identity.erase("task");
    std::string key;
    for (const auto& [k, v] : identity) key += k + "=" + v + ";";
    LeaderboardRun& run = runs[key];
    if (run.press_name.empty()) {
      run.model = fs::path(cell.model).filename().string();
      if (run.model.empty()) run.model = fs::path(cell.model).parent_path().filename().string();
      run.press_name = e.policy;
      run.compression_ratio = full ? 0.0 : 1.0 - budget.ratio;
      run.query_aware = e.question == QuestionMode::Aware;
      run.length = e.task_options.length;
      run.seed = e.task_options.seed;
      run.mode = mode_name(e.mode);
      run.protocol = protocol_name(e.protocol);
      run.policy_options = e.policy_options.params.to_string();
      run.version = kvevict_version();
    }
    const std::string path = predictions_file(folder, cell);
    if (path.empty()) {
      leave_out(cell, "no predictions file (the cell has not run)");
      continue;
    }
    auto predictions = read_cell_predictions(path, subtask);
    run.predictions.insert(run.predictions.end(), predictions.begin(), predictions.end());
  }
  for (const auto& [why, cells] : left_out) notes->push_back("left out (" + why + "):" + cells);
  std::vector<LeaderboardRun> out;
  for (auto& [key, run] : runs)
    if (!run.predictions.empty()) out.push_back(std::move(run));
  return out;
}

}  // namespace kvevict
