#include "harness/config/analyze_entries.h"

#include <filesystem>
#include <limits>
#include <set>

#include "harness/common/config_reader.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/output_paths.h"
#include "harness/config/sweep_grid.h"
#include "tasks/task.h"

namespace kvevict {
namespace fs = std::filesystem;

std::vector<AnalyzeEntry> read_analyze_entries(const nlohmann::json& config, const std::string& path,
                                               const std::string& out, const AnalyzeEntry& defaults,
                                               const PolicyOptions& policy_options, const std::string& data_override) {
  const ConfigObject top(config, path, sweep_config_keys());
  if (!top.raw("analyze").is_array()) throw Error(path + ": no \"analyze\" list");
  const std::vector<std::string> keys = {"name",       "text_file",       "task",           "limit", "shots",
                                         "max_tokens", "recall_policies", "recall_budgets", "deltas"};
  constexpr long long kMost = std::numeric_limits<int>::max();
  std::vector<AnalyzeEntry> entries;
  std::set<std::string> names;
  for (const auto& item : top.raw("analyze")) {
    const std::string name = ConfigObject(item, path + ": an \"analyze\" entry", keys).text("name", "");
    if (name.empty()) throw Error(path + ": an \"analyze\" entry has no \"name\"");
    const ConfigObject entry(item, path + ": analyze entry \"" + name + "\"", keys);
    // The name is the entry's folder under --out: one path component, nothing that leaves it.
    if (name == "." || name == ".." || name.find_first_of(std::string("/\\\0", 3)) != std::string::npos)
      throw Error(entry.name("name") + ": \"" + name + "\" is not a folder name (one path component, no / or ..)");
    if (!names.insert(name).second) throw Error(entry.name("name") + ": two entries write to " + name + "/");
    if (entry.has("text_file") == entry.has("task"))
      throw Error(path + ": analyze entry \"" + name + "\" needs one of \"text_file\" or \"task\"" +
                  (entry.has("task") ? ", not both" : ""));
    AnalyzeEntry e = defaults;
    e.name = name;
    e.out = (fs::path(out) / name).string();
    e.text_file = entry.has("text_file") ? data_path(entry.text("text_file", ""), data_override) : "";
    e.task = entry.text("task", "");
    e.limit = entry.integer("limit", e.limit, -1, kMost);
    if (e.limit == 0) throw Error(entry.name("limit") + ": 0 documents (-1: all)");
    e.shots = entry.integer("shots", e.shots, 0, kMost);
    e.max_tokens = entry.integer("max_tokens", e.max_tokens, 1, kMost);
    e.recall_policies = entry.texts("recall_policies", e.recall_policies);
    e.recall_budgets = entry.numbers("recall_budgets", e.recall_budgets, 0, 1);
    for (double b : e.recall_budgets)
      if (!(b > 0)) throw Error(entry.name("recall_budgets") + ": a budget of 0 keeps nothing");
    e.deltas = entry.integers("deltas", e.deltas, 1, kMost);
    check_output_folder(e.out, entry.name("name"));
    try {
      if (!e.task.empty()) make_task(e.task);
    } catch (const Error& error) {
      throw Error(entry.name("task") + ": " + error.what());
    }
    try {
      for (const auto& policy : e.recall_policies) make_policy(policy, policy_options);
    } catch (const Error& error) {
      throw Error(entry.name("recall_policies") + ": " + error.what());
    }
    entries.push_back(e);
  }
  return entries;
}

}  // namespace kvevict
