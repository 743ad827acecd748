#include "harness/sweep/slurm.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/model/model.h"
#include "tasks/task.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------
// Running Slurm's commands: argv only (no shell), stdout captured, stderr kept for errors.

struct ProcessResult {
  int exit_code = -1;
  std::string out, err;
};

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) dir = ".";
    const std::string candidate = (fs::path(dir) / name).string();
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
  }
  return "";
}

std::string read_fd(int fd) {
  std::string text;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

ProcessResult run_process(const std::vector<std::string>& argv) {
  ProcessResult result;
  char err_template[] = "/tmp/kvevict-slurm-stderr-XXXXXX";
  int err_fd = ::mkstemp(err_template);
  int out_pipe[2];
  if (err_fd < 0 || ::pipe(out_pipe) != 0) throw Error("cannot run " + argv[0] + ": no pipe or temporary file");
  ::unlink(err_template);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_fd);
    throw Error("cannot run " + argv[0] + ": fork failed");
  }
  result.out = read_fd(out_pipe[0]);
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ::lseek(err_fd, 0, SEEK_SET);
  result.err = read_fd(err_fd);
  ::close(err_fd);
  return result;
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// ---------------------------------------------------------------------------------
// Options: command line over the config's "slurm" block over defaults.

const int kDefaultMaxShards = 10;

// #SBATCH values are parsed by sbatch, not a shell; a narrow character set keeps a
// config from smuggling extra directives or lines into the script.
std::string checked_value(const std::string& what, const std::string& value) {
  if (value.empty()) throw Error(what + " is empty");
  for (char c : value)
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::string("_.:,=/@+-").find(c) == std::string::npos)
      throw Error(what + " \"" + value + "\": Slurm option values may only hold letters, digits and _.:,=/@+-");
  return value;
}

struct SlurmOptions {
  int shards = 0;
  int max_parallel = 0;  // 0: no limit
  // sbatch long option -> value, in script order.
  std::vector<std::pair<std::string, std::string>> pass_through;
};

// The pass-through options: config key, sbatch option, command-line value.
struct PassThrough {
  const char* key;
  const char* option;
};
const PassThrough kPassThrough[] = {{"partition", "partition"}, {"account", "account"},
                                    {"time", "time"},           {"cpus_per_task", "cpus-per-task"},
                                    {"mem", "mem"},             {"gres", "gres"}};

SlurmOptions resolve_options(const SlurmArgs& args, const json& raw_config, const std::string& config_path,
                             size_t cell_count) {
  json block = raw_config.contains("slurm") ? raw_config["slurm"] : json::object();
  if (!block.is_object()) throw Error(config_path + ": key \"slurm\" must be an object");
  std::set<std::string> known = {"shards", "max_parallel"};
  for (const auto& p : kPassThrough) known.insert(p.key);
  for (auto& [key, _] : block.items())
    if (!known.count(key)) throw Error(config_path + ": unknown key \"slurm." + key + "\"");
  auto block_int = [&](const std::string& key) -> std::optional<int> {
    if (!block.contains(key)) return std::nullopt;
    if (!block[key].is_number_integer()) throw Error(config_path + ": key \"slurm." + key + "\" must be an integer");
    return block[key].get<int>();
  };
  // A count from its flag (-1: not given), else from the config's slurm block; at least 1.
  auto positive = [&](int flag_value, const std::string& flag, const std::string& key) -> std::optional<int> {
    if (flag_value != -1) {
      if (flag_value < 1) throw Error(flag + " " + std::to_string(flag_value) + ": must be at least 1");
      return flag_value;
    }
    auto n = block_int(key);
    if (n && *n < 1) throw Error(config_path + ": key \"slurm." + key + "\" must be at least 1");
    return n;
  };
  SlurmOptions options;
  options.shards = positive(args.shards, "--shards", "shards")
                       .value_or(static_cast<int>(std::min<size_t>(cell_count, kDefaultMaxShards)));
  if (static_cast<size_t>(options.shards) > cell_count)
    throw Error("--shards " + std::to_string(options.shards) + " is more than the sweep's " +
                std::to_string(cell_count) + " cells");
  if (auto k = positive(args.max_parallel, "--max-parallel", "max_parallel")) options.max_parallel = *k;
  const std::map<std::string, std::string> given = {
      {"partition", args.partition}, {"account", args.account}, {"time", args.time},
      {"cpus_per_task", args.cpus_per_task == -1 ? "" : std::to_string(args.cpus_per_task)},
      {"mem", args.mem},             {"gres", args.gres}};
  if (args.cpus_per_task != -1 && args.cpus_per_task < 1)
    throw Error("--cpus-per-task " + std::to_string(args.cpus_per_task) + ": must be at least 1");
  for (const auto& p : kPassThrough) {
    std::string value = given.at(p.key);
    std::string what = std::string("--") + p.option;
    if (value.empty() && block.contains(p.key)) {
      const auto& v = block[p.key];
      if (v.is_string()) value = v.get<std::string>();
      else if (v.is_number_integer()) value = std::to_string(v.get<long long>());
      else throw Error(config_path + ": key \"slurm." + std::string(p.key) + "\" must be a string");
      what = config_path + ": key \"slurm." + std::string(p.key) + "\"";
    }
    if (!value.empty()) options.pass_through.push_back({p.option, checked_value(what, value)});
  }
  return options;
}

// ---------------------------------------------------------------------------------
// The sweep folder.

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string job_name(const json& config, const std::string& config_path) {
  std::string name = config.value("name", fs::path(config_path).stem().string());
  for (auto& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return "kvevict-" + name;
}

// "0-2", "0,3,5": the --array list of shard indices, with "%K" when K limits it.
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

struct SweepFolder {
  std::string dir;  // absolute
  std::string slurm_dir() const { return (fs::path(dir) / "slurm").string(); }
  std::string record() const { return (fs::path(dir) / "slurm" / "sweep.json").string(); }
  std::string array_script() const { return (fs::path(dir) / "slurm" / "sweep.sbatch").string(); }
  std::string merge_script() const { return (fs::path(dir) / "slurm" / "merge.sbatch").string(); }
  std::string shard_dir(int i) const { return (fs::path(dir) / "shards" / std::to_string(i)).string(); }
  std::string shard_log(int i, const std::string& job) const {
    return (fs::path(dir) / "slurm" / ("shard-" + std::to_string(i) + "-" + job + ".log")).string();
  }
  std::string merge_log(const std::string& job) const {
    return (fs::path(dir) / "slurm" / ("merge-" + job + ".log")).string();
  }
};

// What the folder holds must be this sweep split the same way; anything else is refused
// before a single file is written.
void check_folder_holds_this_sweep(const SweepFolder& folder, const json& config, int shards) {
  const std::string different = ": this folder holds a different sweep config's results; use another --out";
  if (fs::exists(folder.record())) {
    json record = read_json_file(folder.record());
    if (record["config"] != config) throw Error(folder.record() + different);
    if (record["shards"] != shards)
      throw Error(folder.record() + ": this sweep was split into " + record["shards"].dump() +
                  " shards; keep --shards " + record["shards"].dump() + " or use another --out");
  }
  const std::string merged = (fs::path(folder.dir) / "config.json").string();
  if (fs::exists(merged)) {
    json record = read_json_file(merged);
    if (record["config"] != config) throw Error(merged + different);
    if (!record.contains("merged_from"))
      throw Error(merged + ": this folder holds an unsharded run of this sweep; use another --out");
  }
  const fs::path shards_dir = fs::path(folder.dir) / "shards";
  if (fs::is_directory(shards_dir)) {
    for (const auto& entry : fs::directory_iterator(shards_dir)) {
      const std::string path = (entry.path() / "config.json").string();
      if (!fs::exists(path)) continue;
      json record = read_json_file(path);
      if (record["config"] != config) throw Error(path + different);
      if (record["shard"] != json::array({std::atoi(entry.path().filename().c_str()), shards}) ||
          entry.path().filename() != std::to_string(record["shard"][0].get<int>()))
        throw Error(path + ": holds shard " + record["shard"].dump() + ", not part of a " + std::to_string(shards) +
                    "-shard split of this folder; use another --out");
    }
  }
}

// The columns that vary across the cells (policy aside) label the table's rows, so
// every (row, policy) has exactly one value per metric.
std::string table_row_key(const SweepPlan& plan) {
  std::map<std::string, std::set<std::string>> values;
  for (const auto& cell : plan.cells)
    for (const auto& [column, value] : cell_identity(cell)) values[column].insert(value);
  std::string key = "task";
  for (const auto& column : result_columns(ColumnRole::setting))
    if (column != "task" && column != "policy" && values[column].size() > 1) key += "," + column;
  return key + ",metric";
}

struct Submission {
  std::string kvevict, config_path, data_dir;
  std::vector<std::string> sweep_overrides;  // --model/--limit as given
};

std::string shard_command(const Submission& s, const SweepFolder& folder, int shards) {
  std::string command = shell_quote(s.kvevict);
  if (!s.data_dir.empty()) command += " --data-dir " + shell_quote(s.data_dir);
  command += " sweep " + shell_quote(s.config_path) + " --out " +
             shell_quote((fs::path(folder.dir) / "shards").string()) + "/\"$shard\" --shard \"$shard/" +
             std::to_string(shards) + "\"";
  for (const auto& o : s.sweep_overrides) command += " " + shell_quote(o);
  return command;
}

void write_scripts(const SweepFolder& folder, const Submission& s, const SlurmOptions& options,
                   const std::string& name, const SweepPlan& plan) {
  std::vector<int> all(options.shards);
  for (int i = 0; i < options.shards; ++i) all[i] = i;
  std::ostringstream array;
  array << "#!/bin/bash\n"
        << "# kvevict sweep as a Slurm job array, one task per shard (written by `kvevict sweep --slurm`).\n"
        << "# A task resumes its shard folder: rerunning it computes only the cells missing there.\n"
        << "#SBATCH --job-name=" << name << "\n"
        << "#SBATCH --array=" << array_spec(all, options.max_parallel) << "\n"
        << "#SBATCH --output=" << folder.slurm_dir() << "/shard-%a-%A.log\n";
  for (const auto& [option, value] : options.pass_through) array << "#SBATCH --" << option << "=" << value << "\n";
  array << "shard=${SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is a job array}\n"
        << "echo \"kvevict shard $shard/" << options.shards
        << ": array job ${SLURM_ARRAY_JOB_ID:-?} task $shard on $(hostname -s)\"\n"
        << shard_command(s, folder, options.shards) << "\n"
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
  for (const auto& [option, value] : options.pass_through)
    if (option == "partition" || option == "account" || option == "time")
      merge << "#SBATCH --" << option << "=" << value << "\n";
  merge << "set -euo pipefail\n" << shell_quote(s.kvevict);
  if (!s.data_dir.empty()) merge << " --data-dir " << shell_quote(s.data_dir);
  merge << " merge";
  for (int i = 0; i < options.shards; ++i) merge << " " << shell_quote(folder.shard_dir(i));
  merge << " --out " << shell_quote(folder.dir) << "\n"
        << shell_quote(s.kvevict) << " table " << shell_quote(folder.dir) << " --rows " << table_row_key(plan)
        << " --cols policy\n";
  write_file_atomically(folder.merge_script(), merge.str());
}

// ---------------------------------------------------------------------------------
// Shard states: the shard folders and logs always; squeue and sacct when they answer.

bool is_active_state(const std::string& state) {
  static const std::set<std::string> active = {"PENDING",   "RUNNING",      "CONFIGURING", "COMPLETING",
                                               "REQUEUED",  "RESIZING",     "SUSPENDED",   "STAGE_OUT",
                                               "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"};
  return active.count(state) > 0;
}

struct JobState {
  std::string state, reason;
};

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

struct ShardStatus {
  int index = 0, done = 0, total = 0;
  std::string job;  // "123_4": the latest array task that ran this shard
  JobState slurm;
  std::string log;
  std::optional<int> exit_code;
  enum Kind { kNotSubmitted, kActive, kDone, kFailed, kUnknown } kind = kUnknown;
  std::string detail;
};

const char* kind_name(ShardStatus::Kind kind) {
  switch (kind) {
    case ShardStatus::kNotSubmitted: return "not submitted";
    case ShardStatus::kActive: return "queued/running";
    case ShardStatus::kDone: return "done";
    case ShardStatus::kFailed: return "FAILED";
    default: return "unknown";
  }
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
  const std::string marker = "kvevict shard exit: ";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(marker, 0) == 0) code = std::atoi(line.c_str() + marker.size());
  return code;
}

// Cells of shard i whose metric rows are all in its results.csv (read only: a torn
// last line is ignored, not repaired).
int finished_cell_count(const SweepFolder& folder, const SweepPlan& plan, int shard, int shards) {
  const std::string csv = (fs::path(folder.shard_dir(shard)) / "results.csv").string();
  if (!fs::exists(csv)) return 0;
  std::map<std::string, size_t> present;
  for (const auto& row : read_results_csv(csv)) present[row_cell_key(row)]++;
  int done = 0;
  for (size_t i = 0; i < plan.cells.size(); ++i)
    if (static_cast<int>(i % shards) == shard) {
      auto it = present.find(plan.cells[i].key());
      if (it != present.end() && it->second >= make_task(plan.cells[i].eval.task)->metric_names().size()) ++done;
    }
  return done;
}

struct SweepState {
  json record;
  SweepPlan plan;
  int shards = 0;
  std::vector<ShardStatus> shard_status;
  std::string merge_job;
  JobState merge_state;
  bool slurm_queryable = false;
};

SweepState read_sweep_state(const SweepFolder& folder, const std::string& data_override) {
  SweepState s;
  if (!fs::exists(folder.record()))
    throw Error(folder.dir + ": not a Slurm sweep folder (no slurm/sweep.json); `kvevict sweep CONFIG --out " +
                folder.dir + " --slurm` makes one");
  s.record = read_json_file(folder.record());
  if (!s.record.contains("config") || !s.record.contains("shards") || !s.record["shards"].is_number_integer())
    throw Error(folder.record() + ": not a kvevict sweep record (no \"config\" or \"shards\")");
  s.shards = s.record["shards"].get<int>();
  s.plan = expand_sweep(s.record["config"], folder.record(), data_dir(data_override));

  // The latest submission of each shard, and every job id to ask Slurm about.
  std::map<int, std::string> latest_array;
  std::vector<std::string> jobs;
  for (const auto& sub : s.record.value("submissions", json::array())) {
    const std::string array_job = sub.value("array_job", "");
    for (int i : sub.value("shards", std::vector<int>{})) latest_array[i] = array_job;
    if (!array_job.empty()) jobs.push_back(array_job);
    s.merge_job = sub.value("merge_job", "");
  }
  if (!s.merge_job.empty()) jobs.push_back(s.merge_job);
  auto states = query_slurm(jobs, s.slurm_queryable);
  if (!s.merge_job.empty() && states.count(s.merge_job)) s.merge_state = states[s.merge_job];

  for (int i = 0; i < s.shards; ++i) {
    ShardStatus st;
    st.index = i;
    for (size_t c = 0; c < s.plan.cells.size(); ++c)
      if (static_cast<int>(c % s.shards) == i) ++st.total;
    st.done = finished_cell_count(folder, s.plan, i, s.shards);
    if (latest_array.count(i)) {
      st.job = latest_array[i] + "_" + std::to_string(i);
      if (states.count(st.job)) st.slurm = states[st.job];
      st.log = folder.shard_log(i, latest_array[i]);
      if (fs::exists(st.log)) st.exit_code = logged_exit_code(st.log);
      else st.log.clear();
    }
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
    } else if (s.slurm_queryable) {
      st.kind = ShardStatus::kFailed;
      st.detail = st.log.empty() ? "no longer queued and never logged: cancelled before it ran?"
                                 : "no longer queued and its log has no exit line: killed (time limit, memory)?";
    } else {
      st.kind = ShardStatus::kUnknown;
      st.detail = "squeue did not answer and the log has no exit line";
    }
    s.shard_status.push_back(st);
  }
  return s;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buffer;
}

std::string resubmit_command(const SweepFolder& folder, const json& record) {
  std::string command = shell_quote(record.value("kvevict", std::string("kvevict")));
  if (!record.value("data_dir", std::string()).empty()) command += " --data-dir " + shell_quote(record["data_dir"]);
  command += " sweep " + shell_quote(record.value("config_path", std::string("CONFIG"))) + " --out " +
             shell_quote(folder.dir) + " --slurm --resubmit-failed";
  for (const auto& o : record.value("sweep_overrides", std::vector<std::string>{})) command += " " + shell_quote(o);
  const json submissions = record.value("submissions", json::array());
  const json options = submissions.empty() ? json::object() : submissions.back().value("sbatch_options", json::object());
  for (const auto& [option, value] : options.items()) command += " --" + option + " " + shell_quote(value.get<std::string>());
  return command;
}

std::string parse_job_id(const ProcessResult& r, const std::string& what) {
  if (r.exit_code != 0)
    throw Error("sbatch refused the " + what + " (exit " + std::to_string(r.exit_code) + "): " +
                first_line(r.err.empty() ? r.out : r.err));
  std::string id = first_line(r.out);
  id = id.substr(0, id.find(';'));  // --parsable prints "id" or "id;cluster"
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos)
    throw Error("sbatch printed no job id for the " + what + ": \"" + first_line(r.out) + "\"");
  return id;
}

// ---------------------------------------------------------------------------------

int run_slurm_sweep(const SweepArgs& args, const SlurmArgs& slurm, const std::string& data_override) {
  if (!args.shard.empty()) throw Error("--shard and --slurm do not go together: --slurm makes the shards (--shards N)");
  json raw_config = read_json_file(args.config);
  json config = raw_config;
  if (!args.model.empty()) config["models"] = json::array({args.model});
  if (args.limit != -2) config["limit"] = args.limit;
  SweepPlan plan = expand_sweep(config, args.config, data_dir(data_override));
  // The model options every shard will use fail here rather than in every array task.
  for (const char* key : {"device", "dtype"})
    if (config.contains(key) && !config[key].is_string()) throw Error(args.config + ": key \"" + key + "\" must be a string");
  parse_dtype(config.value("dtype", std::string("float32")));
  SweepFolder folder;
  folder.dir = fs::absolute(args.out).lexically_normal().string();
  if (folder.dir.size() > 1 && folder.dir.back() == '/') folder.dir.pop_back();
  // A folder keeps the split it was made with unless --shards says otherwise (and is refused).
  SlurmArgs effective = slurm;
  if (effective.shards == -1 && fs::exists(folder.record())) {
    const json stored = read_json_file(folder.record());
    if (stored.contains("shards") && stored["shards"].is_number_integer()) effective.shards = stored["shards"].get<int>();
  }
  SlurmOptions options = resolve_options(effective, raw_config, args.config, plan.cells.size());
  if (folder.dir.find_first_of(" \t\n%'\"\\") != std::string::npos)
    throw Error("--out " + args.out + ": Slurm log paths cannot hold spaces, quotes, backslashes or %");
  if (fs::exists(folder.dir) && !fs::is_directory(folder.dir)) throw Error("--out " + args.out + ": not a folder");
  check_folder_holds_this_sweep(folder, plan.config, options.shards);

  std::string sbatch;
  if (!slurm.dry_run) {
    const std::string wanted = slurm.sbatch.empty() ? "sbatch" : slurm.sbatch;
    sbatch = find_executable(wanted);
    if (sbatch.empty())
      throw Error(slurm.sbatch.empty() ? "--slurm: sbatch is not on PATH (is this a Slurm login node? --sbatch PATH names it)"
                                       : "--sbatch " + slurm.sbatch + ": not an executable file");
  }

  Submission s;
  s.kvevict = fs::read_symlink("/proc/self/exe").string();
  s.config_path = fs::canonical(args.config).string();
  if (!data_override.empty()) s.data_dir = fs::absolute(data_override).lexically_normal().string();
  if (!args.model.empty()) {
    s.sweep_overrides.push_back("--model");
    s.sweep_overrides.push_back(fs::exists(args.model) ? fs::absolute(args.model).lexically_normal().string() : args.model);
  }
  if (args.limit != -2) s.sweep_overrides.insert(s.sweep_overrides.end(), {"--limit", std::to_string(args.limit)});

  json record = fs::exists(folder.record()) ? read_json_file(folder.record()) : json::object();
  if (!record.contains("submissions")) record["submissions"] = json::array();

  // Which shards to submit, and which earlier tasks are still queued or running.
  std::vector<int> to_submit;
  std::vector<std::string> still_active;
  if (!record["submissions"].empty()) {
    SweepState state = read_sweep_state(folder, data_override);
    for (const auto& st : state.shard_status) {
      if (st.kind == ShardStatus::kActive) {
        if (!slurm.resubmit_failed)
          throw Error("shard " + std::to_string(st.index) + " is still " + st.slurm.state + " as Slurm job " + st.job +
                      "; wait for it (kvevict status " + folder.dir + ") or scancel it first");
        still_active.push_back(st.job);
      }
      if (!slurm.resubmit_failed || st.kind == ShardStatus::kFailed) to_submit.push_back(st.index);
    }
    // The last merge job waits on the old array; the new merge job replaces it.
    if (!state.merge_job.empty() && state.merge_state.state == "PENDING") {
      if (std::string scancel = find_executable("scancel"); !scancel.empty() && !slurm.dry_run)
        run_process({scancel, state.merge_job});
    }
  } else {
    if (slurm.resubmit_failed)
      throw Error(folder.dir + ": nothing was submitted from this folder yet; run without --resubmit-failed");
    for (int i = 0; i < options.shards; ++i) to_submit.push_back(i);
  }
  if (to_submit.empty()) {
    std::cout << "no failed shards to resubmit in " << folder.dir << " (kvevict status " << folder.dir << ")\n";
    return 0;
  }

  fs::create_directories(folder.slurm_dir());
  fs::create_directories(fs::path(folder.dir) / "shards");
  record["kvevict"] = s.kvevict;
  record["config_path"] = s.config_path;
  record["config"] = plan.config;
  record["shards"] = options.shards;
  record["cells"] = plan.cells.size();
  record["data_dir"] = s.data_dir;
  record["sweep_overrides"] = s.sweep_overrides;
  write_file_atomically(folder.record(), record.dump(2) + "\n");
  write_scripts(folder, s, options, job_name(config, args.config), plan);

  const bool whole_array = static_cast<int>(to_submit.size()) == options.shards;
  std::vector<std::string> array_cmd = {sbatch.empty() ? "sbatch" : sbatch, "--parsable"};
  if (!whole_array) array_cmd.push_back("--array=" + array_spec(to_submit, options.max_parallel));
  array_cmd.push_back(folder.array_script());
  std::string dependency = "afterok:ARRAY_JOB_ID";
  for (const auto& job : still_active) dependency += ":" + job;

  auto show = [](const std::vector<std::string>& cmd) {
    std::string text;
    for (size_t i = 0; i < cmd.size(); ++i) text += (i ? " " : "") + (i ? cmd[i] : fs::path(cmd[i]).filename().string());
    return text;
  };
  std::vector<std::string> merge_cmd = {sbatch.empty() ? "sbatch" : sbatch, "--parsable",
                                        "--dependency=" + dependency, folder.merge_script()};
  if (slurm.dry_run) {
    std::cout << "wrote " << folder.array_script() << " and " << folder.merge_script()
              << " (dry run: nothing submitted)\n"
              << show(array_cmd) << "\n"
              << show(merge_cmd) << "\n";
    return 0;
  }

  const std::string array_job = parse_job_id(run_process(array_cmd), "job array");
  json submission = {{"array_job", array_job}, {"shards", to_submit}, {"submitted", now_utc()},
                     {"sbatch_options", json::object()}};
  for (const auto& [option, value] : options.pass_through) submission["sbatch_options"][option] = value;
  dependency.replace(dependency.find("ARRAY_JOB_ID"), 12, array_job);
  merge_cmd[2] = "--dependency=" + dependency;
  std::string merge_error;
  try {
    submission["merge_job"] = parse_job_id(run_process(merge_cmd), "merge job");
  } catch (const Error& e) {
    merge_error = e.what();
    submission["merge_job"] = "";
  }
  record["submissions"].push_back(submission);
  write_file_atomically(folder.record(), record.dump(2) + "\n");
  if (!merge_error.empty())
    throw Error(merge_error + "; the array " + array_job + " is submitted: merge by hand afterwards with " +
                "`kvevict merge " + folder.dir + "/shards/* --out " + folder.dir + "`");
  std::cout << "submitted array job " << array_job << " (shards " << array_spec(to_submit, options.max_parallel)
            << " of " << options.shards << ") and merge job " << submission["merge_job"].get<std::string>()
            << " (after it succeeds)\n"
            << "logs: " << folder.slurm_dir() << "/\n"
            << "follow with: kvevict status " << folder.dir << "\n";
  return 0;
}

}  // namespace

int run_status(const StatusArgs& args, const std::string& data_override) {
  SweepFolder folder;
  folder.dir = fs::absolute(args.dir).lexically_normal().string();
  if (folder.dir.size() > 1 && folder.dir.back() == '/') folder.dir.pop_back();
  if (!fs::is_directory(folder.dir)) throw Error(args.dir + ": no such folder");
  SweepState state = read_sweep_state(folder, data_override);
  std::cout << "sweep " << folder.dir << ": " << state.plan.cells.size() << " cells in " << state.shards
            << " shards (config " << state.record.value("config_path", std::string("?")) << ")\n";
  if (!state.slurm_queryable)
    std::cout << "(squeue is not on PATH or did not answer: states come from the shard folders and logs)\n";
  std::vector<const ShardStatus*> failed;
  for (const auto& st : state.shard_status) {
    std::cout << "shard " << st.index << ": " << st.done << "/" << st.total << " cells  " << kind_name(st.kind);
    if (!st.job.empty()) {
      std::cout << "  (Slurm " << st.job;
      if (!st.slurm.state.empty()) std::cout << " " << st.slurm.state;
      if (!st.slurm.reason.empty() && st.slurm.reason != "None") std::cout << ", " << st.slurm.reason;
      if (st.exit_code) std::cout << ", exit " << *st.exit_code;
      std::cout << ")";
    }
    if (!st.detail.empty()) std::cout << "  " << st.detail;
    std::cout << "\n";
    if (st.kind == ShardStatus::kFailed) failed.push_back(&st);
  }
  const std::string csv = (fs::path(folder.dir) / "results.csv").string();
  std::cout << "merge: ";
  if (!state.merge_job.empty()) {
    std::cout << "job " << state.merge_job;
    if (!state.merge_state.state.empty()) std::cout << " " << state.merge_state.state;
    if (!state.merge_state.reason.empty() && state.merge_state.reason != "None")
      std::cout << " (" << state.merge_state.reason << ")";
    std::cout << "; ";
  }
  if (fs::exists(csv)) std::cout << csv << " written (" << read_results_csv(csv).size() << " rows)\n";
  else std::cout << "results.csv not written yet\n";
  std::cout << "failed shards: ";
  if (failed.empty()) std::cout << "none\n";
  for (size_t i = 0; i < failed.size(); ++i) std::cout << failed[i]->index << (i + 1 < failed.size() ? " " : "\n");
  for (const auto* st : failed) {
    if (st->log.empty()) {
      std::cout << "--- shard " << st->index << ": no log (" << folder.slurm_dir() << "/shard-" << st->index << "-*.log)\n";
      continue;
    }
    std::cout << "--- shard " << st->index << ", last lines of " << st->log << ":\n";
    for (const auto& line : last_lines(st->log, static_cast<size_t>(std::max(1, args.log_lines))))
      std::cout << "  " << line << "\n";
  }
  if (!failed.empty())
    std::cout << "resubmit only the failed shards with:\n  " << resubmit_command(folder, state.record) << "\n";
  return 0;
}

int run_sweep_command(const SweepArgs& sweep, const SlurmArgs& slurm, const std::string& data_override) {
  if (slurm.slurm) return run_slurm_sweep(sweep, slurm, data_override);
  const std::vector<std::pair<bool, const char*>> slurm_only = {
      {slurm.shards != -1, "--shards"},         {slurm.max_parallel != -1, "--max-parallel"},
      {!slurm.partition.empty(), "--partition"}, {!slurm.account.empty(), "--account"},
      {!slurm.time.empty(), "--time"},           {slurm.cpus_per_task != -1, "--cpus-per-task"},
      {!slurm.mem.empty(), "--mem"},             {!slurm.gres.empty(), "--gres"},
      {slurm.dry_run, "--dry-run"},              {!slurm.sbatch.empty(), "--sbatch"},
      {slurm.resubmit_failed, "--resubmit-failed"}};
  for (const auto& [given, flag] : slurm_only)
    if (given) throw Error(std::string(flag) + " needs --slurm");
  return run_sweep(sweep, data_override);
}

}  // namespace kvevict
