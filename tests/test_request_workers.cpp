// Whole requests on several threads (Model::request_workers, for_each_request): every
// number must be the one a serial run gives, byte for byte, and a failing request must
// end the run with its own one-line error.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/eval/request_workers.h"
#include "harness/model/model.h"
#include "harness/model/threads.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

// Runs `args` with --threads 1 (one request at a time) and --threads 2 (two at once) and
// returns both predictions files.
std::pair<std::string, std::string> predictions_serial_and_parallel(const std::string& name, const std::string& args) {
  const std::string dir = test::temp_dir("request_workers_" + name);
  std::vector<std::string> files;
  for (const char* threads : {"1", "2"}) {
    const std::string path = dir + "/threads" + threads + ".jsonl";
    const auto run = test::run_kvevict(args + " --threads " + threads + " --predictions " + path);
    INFO(args << " --threads " << threads << ": " << run.err);
    REQUIRE(run.exit_code == 0);
    files.push_back(test::read_text(path));
  }
  return {files[0], files[1]};
}

}  // namespace

TEST_CASE("for_each_request runs every index once and reports progress in order", "[request_workers]") {
  for (int workers : {1, 2, 3}) {
    INFO("workers " << workers);
    std::vector<std::atomic<int>> runs(17);
    std::vector<int> reported;
    for_each_request(17, workers, [&](int i) { runs[i] += 1; }, [&](int done) { reported.push_back(done); });
    for (int i = 0; i < 17; ++i) CHECK(runs[i] == 1);
    std::vector<int> expected(17);
    for (int i = 0; i < 17; ++i) expected[i] = i + 1;
    CHECK(reported == expected);
  }
}

TEST_CASE("for_each_request rethrows the error a serial loop meets first", "[request_workers][errors]") {
  for (int workers : {1, 2}) {
    INFO("workers " << workers);
    std::atomic<int> started{0};
    try {
      for_each_request(40, workers, [&](int i) {
        started += 1;
        if (i == 5 || i == 6 || i == 30) throw Error("request " + std::to_string(i) + " failed");
      }, {});
      FAIL("no error surfaced");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) == "request 5 failed");
    }
    CHECK(started < 40);  // requests not yet started when it failed are skipped
  }
}

TEST_CASE("a tiny model runs each op on one thread and its threads take whole requests", "[request_workers]") {
  const int before = at::get_num_threads();
  ModelOptions options;
  options.threads = 3;
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  use_threads_for(*model, options.threads);
  CHECK(model->request_workers() == 3);
  CHECK(at::get_num_threads() == 1);
  options.threads = 0;
  model = Model::load(test::data("models/stories260K-hf"), options);
  use_threads_for(*model, options.threads);
  CHECK(model->request_workers() == physical_core_count());
  set_thread_count(before);
}

TEST_CASE("a model loaded after a tiny one gets back the threads the tiny one set aside", "[request_workers]") {
  // A sweep loads its models in turn, in one process, without --threads.
  const int before = at::get_num_threads();
  set_thread_count(2);
  const auto dir = test::temp_dir("after_tiny");
  auto made = test::run_kvevict("make-random-model --out " + dir + " --layers 1 --hidden 256 --heads 4 --kv-heads 4"
                                " --intermediate 64 --vocab 64 --max-positions 32");
  REQUIRE(made.exit_code == 0);
  // Model::load itself leaves the process's threads alone; the caller applies them.
  auto tiny = Model::load(test::data("models/stories260K-hf"));
  CHECK(at::get_num_threads() == 2);
  use_threads_for(*tiny, 0);
  CHECK(at::get_num_threads() == 1);
  auto bigger = Model::load(dir);
  use_threads_for(*bigger, 0);
  CHECK(bigger->request_workers() == 1);
  CHECK(at::get_num_threads() == 2);
  // --threads still wins: the bigger model keeps what it was given.
  tiny = Model::load(test::data("models/stories260K-hf"));
  use_threads_for(*tiny, 0);
  ModelOptions options;
  options.threads = 1;
  bigger = Model::load(dir, options);
  use_threads_for(*bigger, options.threads);
  CHECK(at::get_num_threads() == 1);
  set_thread_count(before);
}

TEST_CASE("requests on two threads give byte-identical predictions to one thread", "[request_workers][eval]") {
  SECTION("h2o in sim mode, RTE") {
    auto [serial, parallel] = predictions_serial_and_parallel(
        "rte_sim", "eval --task rte --limit 24 --policy h2o --budget 0.5 --mode sim");
    CHECK(std::count(serial.begin(), serial.end(), '\n') == 24);
    CHECK(serial == parallel);
  }
  SECTION("h2o in decode mode, COPA") {
    auto [serial, parallel] = predictions_serial_and_parallel(
        "copa_decode", "eval --task copa --limit 16 --policy h2o --budget 0.5 --mode decode");
    CHECK(std::count(serial.begin(), serial.end(), '\n') == 16);
    CHECK(serial == parallel);
  }
  SECTION("h2o-paper through the H2O adaptor, PIQA") {
    auto [serial, parallel] = predictions_serial_and_parallel(
        "piqa_h2o", "eval --task piqa --limit 12 --pipeline h2o --policy h2o-paper --budget 0.4");
    CHECK(serial == parallel);
  }
  SECTION("sampled XSum generations: each document draws from its own seed") {
    auto [serial, parallel] = predictions_serial_and_parallel(
        "xsum_sampled", "eval --task xsum --limit 3 --policy h2o --budget 0.5 --mode decode --max-length 192 "
                        "--temperature 0.8 --seed 7");
    CHECK(std::count(serial.begin(), serial.end(), '\n') == 3);
    CHECK(serial == parallel);
  }
}

TEST_CASE("an error inside a request on a worker thread is the run's one-line error", "[request_workers][errors]") {
  // XSum asks for more new tokens than this window holds: every document fails in its worker.
  const auto run = test::run_kvevict("eval --task xsum --limit 4 --max-length 8 --threads 2");
  CHECK(run.exit_code == 1);
  CHECK(run.out.empty());
  CHECK_THAT(run.err, Catch::Contains("kvevict: error: --max-length 8 leaves no room for the prompt"));
  CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
}
