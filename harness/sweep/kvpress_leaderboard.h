// A sweep's RULER cells as runs of the kvpress leaderboard (NVIDIA/kvpress's
// evaluation/evaluate.py writes one folder per run; the leaderboard takes those folders):
// per (model, policy, budget, question mode, length) one folder
//   ruler__LENGTH__MODEL__POLICY__RATIO[__query_aware]/
//     config.yaml       what ran: dataset, data_dir (the length), model, press_name (the
//                       kvevict policy), compression_ratio (1 - budget), query_aware, seed,
//                       and kvevict's own keys (harness, version, protocol, mode, policy_options)
//     metrics.json      per RULER subtask {"string_match": x} as RULER scores it, and "average"
//     predictions.csv   index, task, context_length, question, answer, predicted_answer
// The metrics are recomputed from predictions.csv alone (read_leaderboard_predictions).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvevict {

// One answered RULER item: a row of predictions.csv.
struct LeaderboardPrediction {
  int64_t index = 0;                // the item's index within its subtask
  std::string task;                 // RULER's subtask name: niah_single_1, vt, cwe, fwe, ...
  int64_t context_length = 0;       // the prompt's tokens (context, question and answer prefix)
  std::string question;             // the question and answer prefix (what agnostic feeds uncompressed)
  std::vector<std::string> answer;  // the reference strings (a JSON list in the file)
  std::string predicted_answer;     // the generated text as the model gave it
};

struct LeaderboardRun {
  std::string model;                // the model folder's name
  std::string press_name;           // the kvevict policy ("snapkv", "ada+snapkv", "full")
  double compression_ratio = 0;     // 1 - the budget ratio (0 for the full cache)
  bool query_aware = false;         // the question was compressed with the context
  int length = 0;                   // the RULER length every item was fitted to
  uint64_t seed = 0;                // the items' seed
  std::string mode, protocol, policy_options, version;
  std::vector<LeaderboardPrediction> predictions;
};

// The run's folder name, as kvpress's get_results_dir forms it.
std::string leaderboard_run_folder(const LeaderboardRun& run);
// Per subtask, RULER's string_match_all x 100 over its items (the prediction
// postprocessed as RULER's evaluator does, rounded to 2 decimals), and "average": the
// mean of the subtasks' scores, rounded to 2 decimals. Subtasks in name order.
nlohmann::json leaderboard_metrics(const std::vector<LeaderboardPrediction>& predictions);
std::string leaderboard_config_yaml(const LeaderboardRun& run);
std::string leaderboard_predictions_csv(const std::vector<LeaderboardPrediction>& predictions);
// Reads predictions.csv back; throws kvevict::Error naming the file and line.
std::vector<LeaderboardPrediction> read_leaderboard_predictions(const std::string& path);
// Writes the run's three files into `parent`/leaderboard_run_folder(run) (each atomically).
// Returns the folder.
std::string write_leaderboard_run(const LeaderboardRun& run, const std::string& parent);

// The sweep folder's runs: its RULER cells (ruler_* tasks under prefill-compress, a
// ratio budget or the full cache) grouped by everything but the task, each cell's
// predictions read from DIR/predictions/ or DIR/shards/*/predictions/. `notes` gets one
// line per group of cells left out, and why. Throws naming the folder or file when the
// sweep did not keep predictions or a file is missing or malformed.
std::vector<LeaderboardRun> leaderboard_runs(const std::string& sweep_dir, std::vector<std::string>* notes);

}  // namespace kvevict
