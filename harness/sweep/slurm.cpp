#include "harness/sweep/slurm.h"

#include <ctime>
#include <filesystem>

#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/process.h"
#include "harness/sweep/slurm_status.h"

namespace kvevict {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buffer;
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

// The sbatch to run: the request's, or sbatch on PATH; empty for a dry run.
std::string find_sbatch(const SlurmRequest& request) {
  if (request.dry_run) return "";
  const std::string wanted = request.sbatch_program.empty() ? "sbatch" : request.sbatch_program;
  const std::string sbatch = find_executable(wanted);
  if (sbatch.empty())
    throw Error(request.sbatch_program.empty()
                    ? "--slurm: sbatch is not on PATH (is this a Slurm login node? --sbatch PATH names it)"
                    : "--sbatch " + request.sbatch_program + ": not an executable file");
  return sbatch;
}

KvevictCall kvevict_call(const SweepSource& source, const std::string& data_override) {
  KvevictCall call;
  call.kvevict = fs::read_symlink("/proc/self/exe").string();
  call.config_path = fs::canonical(source.config_path).string();
  if (!data_override.empty()) call.data_dir = fs::absolute(data_override).lexically_normal().string();
  if (!source.model.empty()) {
    call.sweep_overrides.push_back("--model");
    call.sweep_overrides.push_back(fs::exists(source.model) ? fs::absolute(source.model).lexically_normal().string()
                                                            : source.model);
  }
  if (source.limit) call.sweep_overrides.insert(call.sweep_overrides.end(), {"--limit", std::to_string(*source.limit)});
  return call;
}

struct ShardsToSubmit {
  std::vector<int> shards;
  std::vector<std::string> still_active;  // earlier array tasks still queued or running
};

// Every shard on the first submission; with --resubmit-failed, the failed ones (and the
// new merge job also waits for shards still active, which are an error otherwise).
ShardsToSubmit shards_to_submit(const SweepFolder& folder, const json& record, const SlurmRequest& request,
                                int shard_count, const std::string& data_dir) {
  ShardsToSubmit wanted;
  if (record["submissions"].empty()) {
    if (request.resubmit_failed)
      throw Error(folder.dir + ": nothing was submitted from this folder yet; run without --resubmit-failed");
    for (int i = 0; i < shard_count; ++i) wanted.shards.push_back(i);
    return wanted;
  }
  const SweepStatus status = read_sweep_status(folder, data_dir);
  for (const auto& st : status.shard_status) {
    if (st.kind == ShardStatus::kActive) {
      if (!request.resubmit_failed)
        throw Error("shard " + std::to_string(st.index) + " is still " + st.slurm.state + " as Slurm job " + st.job +
                    "; wait for it (kvevict status " + folder.dir + ") or scancel it first");
      wanted.still_active.push_back(st.job);
    }
    if (!request.resubmit_failed || st.kind == ShardStatus::kFailed) wanted.shards.push_back(st.index);
  }
  // The last merge job waits on the old array; the new merge job replaces it.
  if (!status.merge_job.empty() && status.merge_state.state == "PENDING")
    if (std::string scancel = find_executable("scancel"); !scancel.empty() && !request.dry_run)
      run_process({scancel, status.merge_job});
  return wanted;
}

// Submits the job array, then the merge job that runs after it succeeds, and records
// both; a dry run only fills in the two commands.
void submit_array_and_merge(SlurmSubmission& s, json& record, const SlurmOptions& options, const std::string& sbatch,
                            const std::vector<std::string>& still_active) {
  const std::string program = sbatch.empty() ? "sbatch" : sbatch;
  s.array_command = {program, "--parsable"};
  if (s.shards.size() != static_cast<size_t>(options.shards)) s.array_command.push_back("--array=" + s.array_spec);
  s.array_command.push_back(s.folder.array_script());
  std::string waits_on;
  for (const auto& job : still_active) waits_on += ":" + job;
  auto merge_command = [&](const std::string& array_job) {
    return std::vector<std::string>{program, "--parsable", "--dependency=afterok:" + array_job + waits_on,
                                    s.folder.merge_script()};
  };
  if (s.dry_run) {
    s.merge_command = merge_command("ARRAY_JOB_ID");
    return;
  }
  s.array_job = parse_job_id(run_process(s.array_command), "job array");
  s.merge_command = merge_command(s.array_job);
  json submission = {{"array_job", s.array_job}, {"shards", s.shards}, {"submitted", now_utc()},
                     {"sbatch_options", json::object()}};
  for (const auto& [option, value] : options.sbatch) submission["sbatch_options"][option] = value;
  std::string merge_error;
  try {
    s.merge_job = parse_job_id(run_process(s.merge_command), "merge job");
  } catch (const Error& e) {
    merge_error = e.what();
  }
  submission["merge_job"] = s.merge_job;
  record["submissions"].push_back(submission);
  write_file_atomically(s.folder.slurm_record(), record.dump(2) + "\n");
  if (!merge_error.empty())
    throw Error(merge_error + "; the array " + s.array_job + " is submitted: merge by hand afterwards with " +
                "`kvevict merge " + s.folder.dir + "/shards/* --out " + s.folder.dir + "`");
}

}  // namespace

SlurmSubmission submit_slurm_sweep(const SweepSource& source, const std::string& out, const SlurmRequest& request,
                                   const std::string& data_override) {
  const std::string data = data_dir(data_override);
  const SweepPlan plan = plan_sweep(source, data);
  SlurmSubmission s;
  s.folder = absolute_folder(out);
  s.dry_run = request.dry_run;
  // A folder keeps the split it was made with unless --shards says otherwise (and is refused).
  SlurmRequest effective = request;
  if (!effective.shards && fs::exists(s.folder.slurm_record()))
    effective.shards = read_slurm_record(s.folder).shards;
  const json raw_config = read_json_file(source.config_path);
  const SlurmOptions options = resolve_slurm_options(effective, raw_config, source.config_path, plan.cells.size());
  s.shard_count = options.shards;
  if (s.folder.dir.find_first_of(" \t\n%'\"\\") != std::string::npos)
    throw Error("--out " + out + ": Slurm log paths cannot hold spaces, quotes, backslashes or %");
  check_sweep_output_folder(out, "--out", sweep_inputs(source, plan, data_override));
  check_folder_holds_split(s.folder, plan.config, options.shards);

  const std::string sbatch = find_sbatch(request);
  const KvevictCall call = kvevict_call(source, data_override);
  json record = fs::exists(s.folder.slurm_record()) ? read_json_file(s.folder.slurm_record()) : json::object();
  if (!record.contains("submissions")) record["submissions"] = json::array();
  const ShardsToSubmit wanted = shards_to_submit(s.folder, record, request, options.shards, data);
  s.shards = wanted.shards;
  if (s.shards.empty()) return s;
  s.array_spec = array_spec(s.shards, options.max_parallel);

  fs::create_directories(s.folder.slurm_dir());
  fs::create_directories(s.folder.shards_dir());
  record["kvevict"] = call.kvevict;
  record["config_path"] = call.config_path;
  record["config"] = plan.config;
  record["shards"] = options.shards;
  record["cells"] = plan.cells.size();
  record["data_dir"] = call.data_dir;
  record["sweep_overrides"] = call.sweep_overrides;
  write_file_atomically(s.folder.slurm_record(), record.dump(2) + "\n");
  write_slurm_scripts(s.folder, call, options, raw_config, source.config_path, plan);
  submit_array_and_merge(s, record, options, sbatch, wanted.still_active);
  return s;
}

}  // namespace kvevict
