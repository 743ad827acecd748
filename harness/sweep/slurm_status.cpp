#include "harness/sweep/slurm_status.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/process.h"
#include "harness/sweep/slurm_scripts.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_active_state(const std::string& state) {
  static const std::set<std::string> active = {"PENDING",   "RUNNING",      "CONFIGURING", "COMPLETING",
                                               "REQUEUED",  "RESIZING",     "SUSPENDED",   "STAGE_OUT",
                                               "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"};
  return active.count(state) > 0;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Job (or array task, "123_4") id -> state, for the given job ids. squeue knows the
// live jobs and, for a while (MinJobAge), the finished ones; sacct answers only where
// accounting storage is configured, so both are optional.
// `answered` stays true only when squeue answered every query ("Invalid job id" is an
// answer: the job has left the controller's memory); otherwise a job missing from the
// output says nothing about it.
std::map<std::string, JobState> query_slurm(const std::vector<std::string>& job_ids, bool& answered) {
  std::map<std::string, JobState> states;
  const std::string squeue = find_executable("squeue"), sacct = find_executable("sacct");
  answered = !squeue.empty();
  for (const auto& id : job_ids) {
    if (id.empty()) continue;
    if (!squeue.empty()) {
      auto r = run_process({squeue, "-h", "-r", "-t", "all", "-j", id, "-o", "%i|%T|%r"});
      if (r.exit_code != 0 && r.err.find("Invalid job id") == std::string::npos) answered = false;
      if (r.exit_code == 0)
        for (const auto& line : lines_of(r.out)) {
          auto a = line.find('|'), b = line.find('|', a + 1);
          if (a == std::string::npos || b == std::string::npos) continue;
          states[line.substr(0, a)] = {line.substr(a + 1, b - a - 1), line.substr(b + 1)};
        }
    }
    if (!sacct.empty()) {
      auto r = run_process({sacct, "-n", "-P", "-X", "-j", id, "-o", "JobID,State"});
      if (r.exit_code == 0)
        for (const auto& line : lines_of(r.out)) {
          auto a = line.find('|');
          if (a == std::string::npos) continue;
          const std::string job = line.substr(0, a);
          std::string state = line.substr(a + 1);
          state = state.substr(0, state.find(' '));  // "CANCELLED by 0"
          if (!states.count(job)) states[job] = {state, ""};
        }
    }
  }
  return states;
}

std::vector<std::string> last_lines(const std::string& path, size_t count) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > count) lines.erase(lines.begin());
  }
  return lines;
}

std::optional<int> logged_exit_code(const std::string& log) {
  std::ifstream in(log);
  std::optional<int> code;
  const std::string marker = "kvevict shard exit: ";  // the array script's last line
  for (std::string line; std::getline(in, line);)
    if (line.rfind(marker, 0) == 0) code = std::atoi(line.c_str() + marker.size());
  return code;
}

// What a shard's cells, Slurm's answer and its log say together.
void classify(ShardStatus& st, bool slurm_queryable) {
  if (is_active_state(st.slurm.state)) {
    st.kind = ShardStatus::kActive;
  } else if (st.done == st.total) {
    st.kind = ShardStatus::kDone;
  } else if (st.job.empty()) {
    st.kind = ShardStatus::kNotSubmitted;
  } else if (!st.slurm.state.empty()) {
    st.kind = ShardStatus::kFailed;  // ended (COMPLETED included) with cells missing
  } else if (st.exit_code && *st.exit_code != 0) {
    st.kind = ShardStatus::kFailed;
  } else if (slurm_queryable) {
    st.kind = ShardStatus::kFailed;
    st.detail = st.log.empty() ? "no longer queued and never logged: cancelled before it ran?"
                               : "no longer queued and its log has no exit line: killed (time limit, memory)?";
  } else {
    st.kind = ShardStatus::kUnknown;
    st.detail = "squeue did not answer and the log has no exit line";
  }
}

// A job id as sbatch --parsable printed it (slurm.cpp keeps only the digits).
std::string job_id(const json& value, const std::string& where, const std::string& key) {
  if (!value.is_string()) throw Error(where + ": key \"" + key + "\" must be a job id string");
  const std::string id = value.get<std::string>();
  if (id.size() > 20 || id.find_first_not_of("0123456789") != std::string::npos)
    throw Error(where + ": key \"" + key + "\": \"" + id + "\" is not a Slurm job id (digits only)");
  return id;
}

std::string text_value(const json& object, const std::string& where, const std::string& key) {
  if (!object.contains(key)) return "";
  if (!object[key].is_string()) throw Error(where + ": key \"" + key + "\" must be a string");
  return object[key].get<std::string>();
}

}  // namespace

SlurmRecord read_slurm_record(const SweepFolder& folder) {
  const std::string where = folder.slurm_record();
  SlurmRecord r;
  r.raw = read_json_file(where);
  if (!r.raw.is_object() || !r.raw.contains("config") || !r.raw["config"].is_object() || !r.raw.contains("shards"))
    throw Error(where + ": not a kvevict sweep record (no \"config\" or \"shards\")");
  r.shards = static_cast<int>(json_int(r.raw["shards"], where, "shards", 1, kMaxSlurmShards));
  for (const char* key : {"kvevict", "config_path", "data_dir"}) text_value(r.raw, where, key);
  if (r.raw.contains("sweep_overrides")) {
    const json& overrides = r.raw["sweep_overrides"];
    if (!overrides.is_array()) throw Error(where + ": key \"sweep_overrides\" must be a list of strings");
    for (const auto& o : overrides)
      if (!o.is_string()) throw Error(where + ": key \"sweep_overrides\" must be a list of strings");
  }
  if (!r.raw.contains("submissions")) return r;
  if (!r.raw["submissions"].is_array()) throw Error(where + ": key \"submissions\" must be a list");
  std::set<std::string> known_options;
  for (const auto& o : sbatch_options()) known_options.insert(o.option);
  for (size_t i = 0; i < r.raw["submissions"].size(); ++i) {
    const json& sub = r.raw["submissions"][i];
    const std::string key = "submissions[" + std::to_string(i) + "]";
    if (!sub.is_object()) throw Error(where + ": key \"" + key + "\" must be an object");
    SlurmSubmissionRecord record;
    if (sub.contains("array_job")) record.array_job = job_id(sub["array_job"], where, key + ".array_job");
    if (sub.contains("merge_job")) record.merge_job = job_id(sub["merge_job"], where, key + ".merge_job");
    if (sub.contains("shards")) {
      if (!sub["shards"].is_array()) throw Error(where + ": key \"" + key + ".shards\" must be a list of shard indices");
      for (const auto& index : sub["shards"])
        record.shards.push_back(static_cast<int>(json_int(index, where, key + ".shards", 0, r.shards - 1)));
    }
    if (sub.contains("sbatch_options")) {
      const json& options = sub["sbatch_options"];
      if (!options.is_object()) throw Error(where + ": key \"" + key + ".sbatch_options\" must be an object");
      for (const auto& [option, value] : options.items()) {
        const std::string name = key + ".sbatch_options." + option;
        if (!known_options.count(option)) throw Error(where + ": key \"" + name + "\" is not an sbatch option kvevict passes");
        if (!value.is_string()) throw Error(where + ": key \"" + name + "\" must be a string");
        record.sbatch_options.push_back({option, value.get<std::string>()});
      }
    }
    r.submissions.push_back(record);
  }
  return r;
}

const char* shard_kind_name(ShardStatus::Kind kind) {
  switch (kind) {
    case ShardStatus::kNotSubmitted: return "not submitted";
    case ShardStatus::kActive: return "queued/running";
    case ShardStatus::kDone: return "done";
    case ShardStatus::kFailed: return "FAILED";
    default: return "unknown";
  }
}

std::vector<int> SweepStatus::failed() const {
  std::vector<int> indices;
  for (const auto& st : shard_status)
    if (st.kind == ShardStatus::kFailed) indices.push_back(st.index);
  return indices;
}

SweepStatus read_sweep_status(const SweepFolder& folder, const std::string& data_dir, size_t log_lines) {
  SweepStatus s;
  s.folder = folder;
  if (!fs::exists(folder.slurm_record()))
    throw Error(folder.dir + ": not a Slurm sweep folder (no slurm/sweep.json); `kvevict sweep CONFIG --out " +
                folder.dir + " --slurm` makes one");
  const SlurmRecord record = read_slurm_record(folder);
  s.record = record.raw;
  s.shards = record.shards;
  s.plan = expand_sweep(s.record["config"], folder.slurm_record(), data_dir);
  if (static_cast<size_t>(s.shards) > s.plan.cells.size())
    throw Error(folder.slurm_record() + ": key \"shards\": " + std::to_string(s.shards) + " is more than the sweep's " +
                std::to_string(s.plan.cells.size()) + " cells");

  // The latest submission of each shard, and every job id to ask Slurm about.
  std::map<int, std::string> latest_array;
  std::vector<std::string> jobs;
  for (const auto& sub : record.submissions) {
    for (int i : sub.shards) latest_array[i] = sub.array_job;
    if (!sub.array_job.empty()) jobs.push_back(sub.array_job);
    s.merge_job = sub.merge_job;
  }
  if (!s.merge_job.empty()) jobs.push_back(s.merge_job);
  auto states = query_slurm(jobs, s.slurm_queryable);
  if (!s.merge_job.empty() && states.count(s.merge_job)) s.merge_state = states[s.merge_job];

  for (int i = 0; i < s.shards; ++i) {
    ShardStatus st;
    st.index = i;
    const auto cells = shard_cells(s.plan, Shard{i, s.shards});
    st.total = static_cast<int>(cells.size());
    const auto finished = finished_cells(SweepFolder{folder.shard_dir(i)}.results_csv(), s.plan, /*repair=*/false);
    for (const SweepCell* cell : cells) st.done += static_cast<int>(finished.count(cell->key()));
    if (latest_array.count(i)) {
      st.job = latest_array[i] + "_" + std::to_string(i);
      if (states.count(st.job)) st.slurm = states[st.job];
      st.log = folder.shard_log(i, latest_array[i]);
      if (fs::exists(st.log)) st.exit_code = logged_exit_code(st.log);
      else st.log.clear();
    }
    classify(st, s.slurm_queryable);
    if (st.kind == ShardStatus::kFailed && !st.log.empty() && log_lines > 0) st.log_tail = last_lines(st.log, log_lines);
    s.shard_status.push_back(st);
  }
  if (fs::exists(folder.results_csv())) s.merged_rows = read_results_csv(folder.results_csv()).size();
  return s;
}

std::string resubmit_command(const SweepStatus& status) {
  const json& record = status.record;
  std::string command = shell_quote(record.value("kvevict", std::string("kvevict")));
  if (!record.value("data_dir", std::string()).empty()) command += " --data-dir " + shell_quote(record["data_dir"]);
  command += " sweep " + shell_quote(record.value("config_path", std::string("CONFIG"))) + " --out " +
             shell_quote(status.folder.dir) + " --slurm --resubmit-failed";
  for (const auto& o : record.value("sweep_overrides", std::vector<std::string>{})) command += " " + shell_quote(o);
  const json submissions = record.value("submissions", json::array());
  const json options = submissions.empty() ? json::object() : submissions.back().value("sbatch_options", json::object());
  for (const auto& [option, value] : options.items()) command += " --" + option + " " + shell_quote(value.get<std::string>());
  return command;
}

}  // namespace kvevict
