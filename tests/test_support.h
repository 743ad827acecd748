// Helpers shared by the tests: where the real data is, reading JSON, running the CLI.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kvevict {
class Model;
struct PolicyOptions;
struct ModelOptions;  // harness/model/model.h: the header stays free of LibTorch
struct ResultRow;
}

namespace kvevict::test {

// ../shared/data relative to the repository root, or $KVEVICT_DATA.
std::string data(const std::string& relative);
nlohmann::json read_json(const std::string& path);
std::string read_text(const std::string& path);
// The options the golden tests load their models with: the CPU, or the device named by
// $KVEVICT_TEST_DEVICE (tests/gpu/run_on_device.sh runs the goldens on "cuda" with it).
ModelOptions model_options();
// The bundled stories260K model, loaded once per test process (with model_options()).
const Model& stories();
// The 200 tokens of golden/stories260K_tinystories_T200.json (BOS + the sample text).
std::vector<int> golden_tokens();
// The message of the kvevict::Error fn throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn);
// A registered policy that runs only with a file made for one model's shape
// (duo-attention's pattern_file): the model-free loops over every registered policy skip
// it (they hold every head to the budget), and test_critical_duo.cpp runs it (kept sets,
// budget, sim == decode).
bool needs_pattern_file(const std::string& policy_name);
// A registered policy that scores a sequence's context by a pre-pass of the model
// (kvzip's reconstruction, Policy::prepass): it needs a prefill (no stream protocol) and
// the runtime's table, so the model-free loops and the stream protocol's runs skip it,
// and test_kvzip.cpp runs it (kept sets, budget, the table, sim == decode).
bool needs_prepass(const std::string& policy_name);
// `options`, and for a policy that needs a pattern file one written for `model`'s layers
// x KV heads (made-up scores; at the default head_compression_ratio half the heads
// stream), so the loops over every registered policy on a model run it too.
PolicyOptions runnable_on(const std::string& policy_name, const Model& model, PolicyOptions options);
// A fresh empty temporary folder, $TMPDIR/kvevict_test_<pid>_<name>, removed with all it
// holds when the object goes, by the process that made it (a forked child's exit leaves
// it to its parent).
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int owner_pid_;
};
// A fresh empty temporary folder owned by the running test case: a TempDir removed when
// the case ends however it ends (a failed REQUIRE or an exception too; tests/main.cpp's
// listener calls kvevict_test_case_ended), or at the latest when the process exits.
std::string temp_dir(const std::string& name);

// A results.csv in a fresh temporary folder `name` as an older kvevict wrote it: the
// header without the columns in `missing`, then `row`. Returns its path.
std::string write_older_results(const std::string& name, const std::vector<std::string>& missing, const ResultRow& row);
// The rows of `dir`/results.csv in file order, formatted, without the run-specific
// seconds: what two runs of one sweep must agree on.
std::vector<std::string> rows_without_timing(const std::string& dir);

struct CommandResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};
// The kvevict binary under test (for tests that start it in the background themselves):
// this build's, or $KVEVICT_TEST_BINARY when set (e.g. an older build, to show that a
// test fails without the fix it covers). run_kvevict runs the same one.
std::string kvevict_binary();
// Runs the kvevict binary with the given argument string (shell-quoted by the caller).
CommandResult run_kvevict(const std::string& args);

// Runs the kvevict binary (stdout and stderr discarded); returns its exit code and its
// peak resident memory in KiB (wait4's ru_maxrss of that one process).
std::pair<int, long> run_kvevict_peak_memory(const std::string& args);
// Runs a shell command line (quoted by the caller), capturing its output.
CommandResult run_command(const std::string& command_line);
// This test binary (/proc/self/exe), for tests that rerun one of its cases in a child
// process with a different environment (e.g. ATEN_CPU_CAPABILITY, read once per process).
std::string self_binary();

// n deterministic token ids in [1, vocab), different for each seed: model input that is
// not text.
inline std::vector<int> tokens_of(int n, int seed, int vocab) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1 + (seed * 131 + i * 37 + i * i * 7) % (vocab - 1);
  return t;
}

}  // namespace kvevict::test

// Removes the folders temp_dir made for the case that just ended (called by the test
// runner's listener; weak there, so a runner linked without this file skips it).
extern "C" void kvevict_test_case_ended();

// Catch 2 has no SKIP. A test case that cannot run on this machine says why with this
// and returns before any assertion; CTest reports it as skipped (SKIP_REGULAR_EXPRESSION
// in CMakeLists.txt), and a test run with -w NoAssertions does not count it as passed.
// Only ever at the top of a test case whose whole body depends on the condition: the
// marker makes CTest report the whole case as skipped.
#define KVEVICT_SKIP(reason) WARN("kvevict test skipped: " << reason)
