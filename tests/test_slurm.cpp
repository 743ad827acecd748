// `kvevict sweep --slurm` and `kvevict status`. The [.slurm] tests need a running
// cluster and run under tests/slurm/run_tests.sh (CTest: slurm_cluster); the others
// check the scripts, the by-hand path and bad input without Slurm.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "harness/common/files.h"
#include "notebooks-export/results_csv.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;
namespace fs = std::filesystem;

namespace {

// stories260K, 2 tasks with small limits, 3 policies, 2 budgets: 10 cells.
const char* kSlurmSweep = R"({
  "name": "slurm-test",
  "tasks": ["copa", "perplexity"],
  "policies": ["full", "local", "h2o"],
  "budgets": [0.2, 0.5],
  "limit": 4,
  "max_length": 96
})";

std::string write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

using test::rows_without_timing;

std::string shell_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

// Bounded wait until none of the jobs is pending or running any more.
bool wait_for_jobs(const std::string& ids, int seconds) {
  for (int waited = 0; waited < seconds; waited += 2) {
    if (shell_output("squeue -h -j " + ids + " -o %i 2>/dev/null").empty()) return true;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  return false;
}

std::string job_state(const std::string& id) {
  std::string s = shell_output("squeue -h -t all -j " + id + " -o %T 2>/dev/null");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string first_line_of(const std::string& text) { return text.substr(0, text.find('\n')); }

bool is_one_line_error(const test::CommandResult& r) {
  return r.exit_code != 0 && r.err.rfind("kvevict: error: ", 0) == 0 && r.err.find('\n') == r.err.size() - 1;
}

// A unique folder per process: a second test run on the same machine must not collide.
std::string fresh_dir(const std::string& name) { return test::temp_dir(name + "_" + std::to_string(::getpid())); }

}  // namespace

TEST_CASE("sweep --slurm --shards 3 runs as a 3-task job array and merges to the local run's rows", "[.slurm]") {
  auto dir = fresh_dir("slurm_sweep");
  auto config = write_file(fs::path(dir) / "sweep.json", kSlurmSweep);
  auto local = (fs::path(dir) / "local").string();
  auto out = (fs::path(dir) / "run").string();

  auto submit = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --max-parallel 2");
  INFO(submit.err);
  REQUIRE(submit.exit_code == 0);
  CHECK_THAT(submit.out, Catch::Contains("submitted array job") && Catch::Contains("merge job"));
  // The unsharded local run, while the cluster works.
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + local).exit_code == 0);

  auto record = test::read_json((fs::path(out) / "slurm" / "sweep.json").string());
  REQUIRE(record["submissions"].size() == 1);
  const std::string array_job = record["submissions"][0]["array_job"];
  const std::string merge_job = record["submissions"][0]["merge_job"];
  REQUIRE(wait_for_jobs(array_job + "," + merge_job, 300));
  CHECK(job_state(merge_job) == "COMPLETED");

  REQUIRE(fs::exists(fs::path(out) / "results.csv"));
  CHECK(rows_without_timing(out) == rows_without_timing(local));
  CHECK(rows_without_timing(out).size() == 15);
  CHECK_THAT(test::read_text((fs::path(out) / "table.md").string()),
             Catch::StartsWith("| task | budget | metric | full | local | h2o |"));
  // No temporary file of the atomic writes is left behind.
  for (const auto& entry : fs::directory_iterator(out))
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);

  // The array really ran as 3 tasks: one log per task, each naming its task of this array.
  for (int i = 0; i < 3; ++i) {
    auto log = test::read_text((fs::path(out) / "slurm" / ("shard-" + std::to_string(i) + "-" + array_job + ".log")).string());
    CHECK_THAT(log, Catch::Contains("array job " + array_job + " task " + std::to_string(i)));
    CHECK_THAT(log, Catch::Contains("kvevict shard exit: 0"));
  }
  CHECK(job_state(array_job + "_0") == "COMPLETED");
  CHECK(job_state(array_job + "_2") == "COMPLETED");

  auto status = test::run_kvevict("status " + out);
  REQUIRE(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("shard 0: 4/4 cells  done") && Catch::Contains("shard 2: 3/3 cells  done"));
  CHECK_THAT(status.out, Catch::Contains("failed shards: none"));
  CHECK_THAT(status.out, Catch::Contains("results.csv written (15 rows)"));
}

TEST_CASE("a shard that fails once: status names it, --resubmit-failed reruns only it, the merge completes", "[.slurm]") {
  auto dir = fresh_dir("slurm_fault");
  // One cell per model; m3 appears only after the first attempt. With 3 shards cells go
  // round-robin, so shard 0 holds m0 (finishes) and m3 (fails).
  std::string models;
  for (int m = 0; m < 6; ++m) {
    auto path = fs::path(dir) / "models" / ("m" + std::to_string(m));
    if (m != 3) {
      fs::create_directories(path.parent_path());
      fs::create_directory_symlink(test::data("models/stories260K-hf"), path);
    }
    models += std::string(m ? ", " : "") + "\"" + path.string() + "\"";
  }
  auto config = write_file(fs::path(dir) / "sweep.json",
                           R"({"name": "slurm-fault", "models": [)" + models +
                               R"(], "tasks": ["perplexity"], "policies": ["h2o"], "budgets": [0.2], "max_length": 64})");
  auto out = (fs::path(dir) / "run").string();
  auto shard_csv = [&](int i) { return (fs::path(out) / "shards" / std::to_string(i) / "results.csv").string(); };

  auto submit = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --partition debug --time 10:00");
  INFO(submit.err);
  REQUIRE(submit.exit_code == 0);
  auto record = test::read_json((fs::path(out) / "slurm" / "sweep.json").string());
  const std::string first_array = record["submissions"][0]["array_job"];
  const std::string first_merge = record["submissions"][0]["merge_job"];
  REQUIRE(wait_for_jobs(first_array + "," + first_merge, 300));
  CHECK(job_state(first_array + "_0") == "FAILED");
  CHECK_FALSE(fs::exists(fs::path(out) / "results.csv"));  // the merge never ran

  auto status = test::run_kvevict("status " + out);
  REQUIRE(status.exit_code == 0);
  INFO(status.out);
  CHECK_THAT(status.out, Catch::Contains("shard 0: 1/2 cells  FAILED"));
  CHECK_THAT(status.out, Catch::Contains("shard 1: 2/2 cells  done"));
  CHECK_THAT(status.out, Catch::Contains("failed shards: 0\n"));
  CHECK_THAT(status.out, Catch::Contains("cell failed") && Catch::Contains("m3"));  // the log's last lines
  const std::string intro = "resubmit only the failed shards with:\n  ";
  const auto at = status.out.find(intro);
  REQUIRE(at != std::string::npos);
  const std::string resubmit_command = first_line_of(status.out.substr(at + intro.size()));
  CHECK_THAT(resubmit_command, Catch::EndsWith(" --slurm --resubmit-failed --partition 'debug' --time '10:00'"));

  const std::string shard0_before = test::read_text(shard_csv(0));
  const std::string shard1_before = test::read_text(shard_csv(1));
  const std::string shard2_before = test::read_text(shard_csv(2));
  fs::create_directory_symlink(test::data("models/stories260K-hf"), fs::path(dir) / "models" / "m3");

  // The command status printed, as the user would paste it.
  const std::string resubmitted = shell_output(resubmit_command + " 2>&1");
  INFO(resubmitted);
  CHECK_THAT(resubmitted, Catch::Contains("(shards 0 of 3)"));
  record = test::read_json((fs::path(out) / "slurm" / "sweep.json").string());
  REQUIRE(record["submissions"].size() == 2);
  CHECK(record["submissions"][1]["shards"] == nlohmann::json::array({0}));
  const std::string second_array = record["submissions"][1]["array_job"];
  const std::string second_merge = record["submissions"][1]["merge_job"];
  REQUIRE(wait_for_jobs(second_array + "," + second_merge, 300));
  CHECK(job_state(second_merge) == "COMPLETED");

  // Only shard 0 ran again, and only its missing cell.
  auto log = test::read_text((fs::path(out) / "slurm" / ("shard-0-" + second_array + ".log")).string());
  CHECK_THAT(log, Catch::Contains("already done 1, to run 1"));
  CHECK_FALSE(fs::exists(fs::path(out) / "slurm" / ("shard-1-" + second_array + ".log")));
  CHECK_FALSE(fs::exists(fs::path(out) / "slurm" / ("shard-2-" + second_array + ".log")));
  CHECK(test::read_text(shard_csv(1)) == shard1_before);
  CHECK(test::read_text(shard_csv(2)) == shard2_before);
  CHECK(test::read_text(shard_csv(0)).rfind(shard0_before, 0) == 0);  // finished rows untouched

  // Every cell once: 6 models x (mean_nll, ppl).
  auto rows = read_results_csv((fs::path(out) / "results.csv").string());
  CHECK(rows.size() == 12);
  std::set<std::string> keys;
  for (const auto& row : rows) keys.insert(row.model + "|" + row.metric);
  CHECK(keys.size() == 12);
  auto after = test::run_kvevict("status " + out);
  CHECK_THAT(after.out, Catch::Contains("failed shards: none"));
}

TEST_CASE("sweep --slurm refuses to submit again while a shard is still queued", "[.slurm]") {
  auto dir = fresh_dir("slurm_queued");
  auto config = write_file(fs::path(dir) / "sweep.json", kSlurmSweep);
  auto out = (fs::path(dir) / "run").string();
  // The real sbatch with --hold: every job stays PENDING until released, so the shards are
  // certainly still queued when the second submission comes.
  auto held_sbatch = write_file(fs::path(dir) / "sbatch_hold", "#!/bin/sh\nexec sbatch --hold \"$@\"\n");
  fs::permissions(held_sbatch, fs::perms::owner_all);
  auto submit = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 2 --sbatch " + held_sbatch);
  INFO(submit.err);
  REQUIRE(submit.exit_code == 0);
  const auto record_path = (fs::path(out) / "slurm" / "sweep.json").string();
  const std::string record_before = test::read_text(record_path);
  auto record = test::read_json(record_path);
  REQUIRE(record["submissions"].size() == 1);
  const std::string array_job = record["submissions"][0]["array_job"];
  const std::string merge_job = record["submissions"][0]["merge_job"];
  CHECK(job_state(array_job + "_0") == "PENDING");

  // Submitting the same sweep again would run shard 0 twice into the same folder.
  auto again = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --sbatch " + held_sbatch);
  CHECK(is_one_line_error(again));
  CHECK(again.exit_code == 1);
  CHECK_THAT(again.err, Catch::Contains("shard 0 is still PENDING as Slurm job " + array_job) &&
                            Catch::Contains("scancel it first"));
  // Nothing new was submitted or recorded: every job in the queue is one of the two
  // (Slurm numbers jobs in submission order, and the merge job came last).
  CHECK(test::read_text(record_path) == record_before);
  const std::string queued = shell_output("squeue -h -o %F 2>/dev/null");
  size_t listed = 0;
  for (size_t at = 0; at < queued.size();) {
    const size_t end = std::min(queued.find('\n', at), queued.size());
    const std::string id = queued.substr(at, end - at);
    at = end + 1;
    if (id.empty()) continue;
    ++listed;
    INFO("queued job " << id);
    CHECK(std::stoll(id) <= std::stoll(merge_job));
  }
  CHECK(listed >= 2);
  // --resubmit-failed finds nothing failed: queued shards are not failed ones.
  auto resubmit = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --resubmit-failed --sbatch " + held_sbatch);
  CHECK(resubmit.exit_code == 0);
  CHECK_THAT(resubmit.out, Catch::Contains("no failed shards to resubmit"));
  CHECK(test::read_text(record_path) == record_before);
  shell_output("scancel " + array_job + " " + merge_job + " 2>&1");
  CHECK(wait_for_jobs(array_job + "," + merge_job, 60));
}

TEST_CASE("sweep --slurm --dry-run writes the array and merge scripts with the pass-through options", "[slurm-cli]") {
  auto dir = fresh_dir("slurm_dry_run");
  auto config_json = nlohmann::json::parse(kSlurmSweep);
  config_json["device"] = "cpu";  // a GPU cluster's config says "cuda"
  config_json["slurm"] = {{"partition", "cpu"}, {"time", "2:00:00"}, {"max_parallel", 4}, {"cpus_per_task", 2}};
  auto config = write_file(fs::path(dir) / "sweep.json", config_json.dump());
  auto out = (fs::path(dir) / "run").string();
  // No sbatch needed for a dry run: PATH holds nothing.
  const std::string path = std::getenv("PATH");
  ::setenv("PATH", "/nonexistent", 1);
  auto r = test::run_kvevict("sweep " + config + " --out " + out +
                             " --slurm --shards 3 --partition gpu --gres gpu:1 --mem 16G --account proj --dry-run");
  ::setenv("PATH", path.c_str(), 1);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string array_script = (fs::path(out) / "slurm" / "sweep.sbatch").string();
  const std::string merge_script = (fs::path(out) / "slurm" / "merge.sbatch").string();
  CHECK_THAT(r.out, Catch::Contains("dry run: nothing submitted"));
  CHECK_THAT(r.out, Catch::Contains("sbatch --parsable " + array_script + "\n"));
  CHECK_THAT(r.out, Catch::Contains("sbatch --parsable --dependency=afterok:ARRAY_JOB_ID " + merge_script));

  auto script = test::read_text(array_script);
  CHECK_THAT(script, Catch::StartsWith("#!/bin/bash\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --array=0-2%4\n"));  // --shards 3, slurm.max_parallel 4
  CHECK_THAT(script, Catch::Contains("#SBATCH --partition=gpu\n"));  // the flag beats the config
  CHECK_THAT(script, Catch::Contains("#SBATCH --time=2:00:00\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --cpus-per-task=2\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --gres=gpu:1\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --mem=16G\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --account=proj\n"));
  CHECK_THAT(script, Catch::Contains("#SBATCH --output=" + out + "/slurm/shard-%a-%A.log\n"));
  CHECK_THAT(script, Catch::Contains(" sweep '" + fs::canonical(config).string() + "' --out '" + out +
                                     "/shards'/\"$shard\" --shard \"$shard/3\""));
  CHECK(script.find("#SBATCH --partition=cpu") == std::string::npos);

  auto merge = test::read_text(merge_script);
  CHECK_THAT(merge, Catch::Contains("#SBATCH --partition=gpu\n"));
  CHECK(merge.find("--gres") == std::string::npos);  // the merge needs no GPU
  CHECK_THAT(merge, Catch::Contains(" merge '" + out + "/shards/0' '" + out + "/shards/1' '" + out + "/shards/2' --out '" +
                                    out + "'\n"));
  CHECK_THAT(merge, Catch::Contains(" table '" + out + "' --rows task,budget,metric --cols policy\n"));
  CHECK(test::read_json((fs::path(out) / "slurm" / "sweep.json").string())["submissions"].empty());
}

TEST_CASE("a --slurm folder also runs by hand: shard commands, then merge", "[slurm-cli]") {
  auto dir = fresh_dir("slurm_by_hand");
  auto config = write_file(fs::path(dir) / "sweep.json", kSlurmSweep);
  auto out = (fs::path(dir) / "run").string();
  auto local = (fs::path(dir) / "local").string();
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --dry-run").exit_code == 0);
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + local).exit_code == 0);
  std::string shards;
  for (int i = 0; i < 3; ++i) {
    auto shard = (fs::path(out) / "shards" / std::to_string(i)).string();
    REQUIRE(test::run_kvevict("sweep " + config + " --out " + shard + " --shard " + std::to_string(i) + "/3").exit_code == 0);
    shards += " " + shard;
  }
  auto merged = test::run_kvevict("merge" + shards + " --out " + out);
  INFO(merged.err);
  REQUIRE(merged.exit_code == 0);
  CHECK(rows_without_timing(out) == rows_without_timing(local));
  // status reads the folders without any Slurm job to ask about.
  auto status = test::run_kvevict("status " + out);
  REQUIRE(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("shard 1: 3/3 cells  done") && Catch::Contains("failed shards: none"));
  // Merging the same sweep again replaces results.csv with the same rows.
  REQUIRE(test::run_kvevict("merge" + shards + " --out " + out).exit_code == 0);
  CHECK(rows_without_timing(out) == rows_without_timing(local));
}

TEST_CASE("sweep --slurm and status refuse bad input with one line", "[slurm-cli]") {
  auto dir = fresh_dir("slurm_bad_input");
  auto config = write_file(fs::path(dir) / "sweep.json", kSlurmSweep);
  auto out = (fs::path(dir) / "run").string();

  const std::string path = std::getenv("PATH");
  ::setenv("PATH", (fs::path(dir) / "empty").c_str(), 1);
  auto no_sbatch = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3");
  ::setenv("PATH", path.c_str(), 1);
  CHECK(is_one_line_error(no_sbatch));
  CHECK_THAT(no_sbatch.err, Catch::Contains("sbatch is not on PATH"));
  CHECK_FALSE(fs::exists(out));  // refused before writing anything

  auto missing = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --sbatch " + dir + "/no-sbatch");
  CHECK(is_one_line_error(missing));
  CHECK_THAT(missing.err, Catch::Contains("--sbatch " + dir + "/no-sbatch: not an executable file"));

  auto zero = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 0 --dry-run");
  CHECK(is_one_line_error(zero));
  CHECK_THAT(zero.err, Catch::Contains("--shards: 0 must be at least 1"));
  auto too_many = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 11 --dry-run");
  CHECK(is_one_line_error(too_many));
  CHECK_THAT(too_many.err, Catch::Contains("more than the sweep's 10 cells"));
  auto without_slurm = test::run_kvevict("sweep " + config + " --out " + out + " --shards 3");
  CHECK(is_one_line_error(without_slurm));
  CHECK_THAT(without_slurm.err, Catch::Contains("--shards needs --slurm"));
  auto bad_option = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --partition 'gpu --x' --dry-run");
  CHECK(is_one_line_error(bad_option));
  CHECK_THAT(bad_option.err, Catch::Contains("--partition \"gpu --x\""));

  // An --out holding another config's results: a Slurm folder, and a local run's folder.
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --dry-run").exit_code == 0);
  auto other_json = nlohmann::json::parse(kSlurmSweep);
  other_json["limit"] = 3;
  auto other = write_file(fs::path(dir) / "other" / "sweep.json", other_json.dump());
  auto different = test::run_kvevict("sweep " + other + " --out " + out + " --slurm --shards 3 --dry-run");
  CHECK(is_one_line_error(different));
  CHECK_THAT(different.err, Catch::Contains(out + "/slurm/sweep.json: this folder holds a different sweep config's results"));
  auto resharded = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 2 --dry-run");
  CHECK(is_one_line_error(resharded));
  CHECK_THAT(resharded.err, Catch::Contains("split into 3 shards"));
  // A damaged record is named with the key at fault, never a JSON library's message.
  const std::string record_text = test::read_text(out + "/slurm/sweep.json");
  write_file(fs::path(out) / "slurm" / "sweep.json", "[1, 2]");
  auto not_a_record = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --dry-run");
  CHECK(is_one_line_error(not_a_record));
  CHECK_THAT(not_a_record.err, Catch::Contains(out + "/slurm/sweep.json: not a kvevict sweep record"));
  auto record = nlohmann::json::parse(record_text);
  record["shards"] = "3";
  write_file(fs::path(out) / "slurm" / "sweep.json", record.dump());
  auto text_shards = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --dry-run");
  CHECK(is_one_line_error(text_shards));
  CHECK_THAT(text_shards.err, Catch::Contains("slurm/sweep.json") && Catch::Contains("\"shards\""));
  CHECK_THAT(text_shards.err, !Catch::Contains("json.exception"));
  write_file(fs::path(out) / "slurm" / "sweep.json", record_text);
  write_file(fs::path(out) / "shards" / "0" / "config.json", "\"a string\"");
  auto shard_record = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --shards 3 --dry-run");
  CHECK(is_one_line_error(shard_record));
  CHECK_THAT(shard_record.err, Catch::Contains(out + "/shards/0/config.json: not a kvevict sweep record (no \"config\")"));
  REQUIRE(remove_tree((fs::path(out) / "shards" / "0").string()));
  auto local = (fs::path(dir) / "local").string();
  REQUIRE(test::run_kvevict("sweep " + other + " --out " + local + " --limit 1").exit_code == 0);
  auto over_local = test::run_kvevict("sweep " + config + " --out " + local + " --slurm --shards 3 --dry-run");
  CHECK(is_one_line_error(over_local));
  CHECK_THAT(over_local.err, Catch::Contains(local + "/config.json: this folder holds a different sweep config's results"));

  // The model options a GPU sweep sets ("device": "cuda") are checked before any cell runs.
  auto bad_dtype_json = nlohmann::json::parse(kSlurmSweep);
  bad_dtype_json["dtype"] = "float8";
  auto bad_dtype = write_file(fs::path(dir) / "bad_dtype" / "sweep.json", bad_dtype_json.dump());
  auto dtype_error = test::run_kvevict("sweep " + bad_dtype + " --out " + dir + "/bad_dtype/run");
  CHECK(is_one_line_error(dtype_error));
  CHECK_THAT(dtype_error.err, Catch::Contains("unknown dtype \"float8\""));
  auto dtype_at_submit = test::run_kvevict("sweep " + bad_dtype + " --out " + dir + "/bad_dtype/run --slurm --dry-run");
  CHECK(is_one_line_error(dtype_at_submit));
  CHECK_THAT(dtype_at_submit.err, Catch::Contains("unknown dtype \"float8\""));
  bad_dtype_json["device"] = 1;
  write_file(fs::path(dir) / "bad_dtype" / "sweep.json", bad_dtype_json.dump());
  auto device_error = test::run_kvevict("sweep " + bad_dtype + " --out " + dir + "/bad_dtype/run2");
  CHECK(is_one_line_error(device_error));
  CHECK_THAT(device_error.err, Catch::Contains("sweep.json: key \"device\" must be a string"));

  auto not_sweep = test::run_kvevict("status " + dir);
  CHECK(is_one_line_error(not_sweep));
  CHECK_THAT(not_sweep.err, Catch::Contains(dir + ": not a Slurm sweep folder"));
  auto no_folder = test::run_kvevict("status " + dir + "/nowhere");
  CHECK(is_one_line_error(no_folder));
  CHECK_THAT(no_folder.err, Catch::Contains("nowhere: no such folder"));
  auto resubmit_nothing = test::run_kvevict("sweep " + config + " --out " + out + " --slurm --resubmit-failed --dry-run");
  CHECK(is_one_line_error(resubmit_nothing));
  CHECK_THAT(resubmit_nothing.err, Catch::Contains("nothing was submitted from this folder yet"));
}

TEST_CASE("status and --resubmit-failed work from the shard folders and logs when squeue cannot answer", "[slurm-cli]") {
  auto dir = fresh_dir("slurm_no_squeue");
  auto config = write_file(fs::path(dir) / "sweep.json", kSlurmSweep);
  auto out = (fs::path(dir) / "run").string();
  // A stand-in sbatch (shell builtins only: PATH holds nothing) that records its
  // arguments and hands out job ids the way `sbatch --parsable` does on a federation.
  const std::string calls = (fs::path(dir) / "sbatch-calls.txt").string();
  const std::string counter = (fs::path(dir) / "counter").string();
  const std::string sbatch = write_file(fs::path(dir) / "bin" / "fake-sbatch",
                                        "#!/bin/sh\necho \"$*\" >> " + calls + "\nn=100; [ -f " + counter + " ] && read n < " +
                                            counter + "; n=$((n+1)); echo $n > " + counter + "; echo \"$n;testcluster\"\n");
  fs::permissions(sbatch, fs::perms::owner_all);
  const std::string path = std::getenv("PATH");
  auto without_slurm_on_path = [&](const std::string& args) {
    ::setenv("PATH", (fs::path(dir) / "empty").c_str(), 1);
    auto r = test::run_kvevict(args);
    ::setenv("PATH", path.c_str(), 1);
    return r;
  };
  auto submit = without_slurm_on_path("sweep " + config + " --out " + out + " --slurm --shards 3 --sbatch " + sbatch);
  INFO(submit.err);
  REQUIRE(submit.exit_code == 0);
  CHECK_THAT(submit.out, Catch::Contains("submitted array job 101 (shards 0-2 of 3) and merge job 102"));

  // Shards 0 and 2 succeed, shard 1 fails before finishing a cell.
  const std::string slurm_dir = (fs::path(out) / "slurm").string();
  for (int i : {0, 2}) {
    REQUIRE(test::run_kvevict("sweep " + config + " --out " + out + "/shards/" + std::to_string(i) + " --shard " +
                              std::to_string(i) + "/3").exit_code == 0);
    write_file(fs::path(slurm_dir) / ("shard-" + std::to_string(i) + "-101.log"), "kvevict shard exit: 0\n");
  }
  write_file(fs::path(slurm_dir) / "shard-1-101.log",
             "kvevict shard 1/3: array job 101 task 1 on node7\nsimulated: out of memory\nkvevict shard exit: 1\n");

  auto status = without_slurm_on_path("status " + out);
  REQUIRE(status.exit_code == 0);
  INFO(status.out);
  CHECK_THAT(status.out, Catch::Contains("squeue is not on PATH"));
  CHECK_THAT(status.out, Catch::Contains("shard 0: 4/4 cells  done"));
  CHECK_THAT(status.out, Catch::Contains("shard 1: 0/3 cells  FAILED  (Slurm 101_1, exit 1)"));
  CHECK_THAT(status.out, Catch::Contains("failed shards: 1\n"));
  CHECK_THAT(status.out, Catch::Contains("  simulated: out of memory\n"));

  auto resubmit = without_slurm_on_path("sweep " + config + " --out " + out + " --slurm --resubmit-failed --sbatch " + sbatch);
  INFO(resubmit.err);
  REQUIRE(resubmit.exit_code == 0);
  CHECK_THAT(resubmit.out, Catch::Contains("submitted array job 103 (shards 1 of 3) and merge job 104"));
  CHECK(test::read_text(calls) == "--parsable " + slurm_dir + "/sweep.sbatch\n" +
                                      "--parsable --dependency=afterok:101 " + slurm_dir + "/merge.sbatch\n" +
                                      "--parsable --array=1 " + slurm_dir + "/sweep.sbatch\n" +
                                      "--parsable --dependency=afterok:103 " + slurm_dir + "/merge.sbatch\n");
  // Until the new task has logged, it is neither done nor known to have failed.
  auto pending = without_slurm_on_path("status " + out);
  CHECK_THAT(pending.out, Catch::Contains("shard 1: 0/3 cells  unknown  (Slurm 103_1)"));
  CHECK_THAT(pending.out, Catch::Contains("failed shards: none"));
}
