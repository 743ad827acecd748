// The "analyze" list of a config (`kvevict analyze --config`): each entry names its
// output folder under --out and overrides the command line's settings. Every entry is
// read and checked before the first one runs, so a mistake in the last one costs no
// time; errors name the config file, the entry and its key (never a CLI flag).
// Torch-free, so it is fuzzed on its own (fuzz/fuzz_analyze_config.cpp).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "policies/registry.h"

namespace kvevict {

struct AnalyzeEntry {
  std::string name;       // one path component
  std::string out;        // --out/<name>
  std::string text_file;  // resolved under the data folder; empty: the entry names a task
  std::string task;
  int limit = 20, shots = 0, max_tokens = 512;
  std::vector<std::string> recall_policies;
  std::vector<double> recall_budgets;
  std::vector<int> deltas;
};

// `defaults` holds the command line's settings (its name, out, text_file and task are not
// used); `policy_options` are the recall policies' parameters, which each named policy is
// checked with. Output folders are checked (check_output_folder) before anything runs.
std::vector<AnalyzeEntry> read_analyze_entries(const nlohmann::json& config, const std::string& path,
                                               const std::string& out, const AnalyzeEntry& defaults,
                                               const PolicyOptions& policy_options, const std::string& data_override);

}  // namespace kvevict
