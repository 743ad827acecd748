// Off the CPU, no kernel of the project's own may read a tensor through a host pointer:
// every hand-written kernel sits behind a dispatcher that takes only CPU tensors, and
// anything else takes ATen's path. Tensors on the meta device (shapes, no data) stand in
// for a GPU's: a dispatcher that took one into a CPU loop would read a null pointer.
// Also: what a device run's scorer reads with tensor ops equals what the CPU reads in place.
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "harness/model/fused_elementwise.h"
#include "harness/model/matvec.h"
#include "harness/model/model.h"
#include "harness/model/tiled_linear.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/causal_softmax.h"
#include "harness/runtime/scorer.h"
#include "harness/runtime/single_query_attention.h"
#include "policies/registry.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

torch::Tensor meta(at::IntArrayRef shape, torch::ScalarType dtype = torch::kFloat32) {
  return torch::empty(shape, torch::TensorOptions().dtype(dtype).device(torch::kMeta));
}

// A random LLaMA whose matrices are large enough for matvec() (1 MiB), shared by the cases
// and removed when the test process ends.
const std::string& random_llama_dir() {
  static const test::TempDir dir("device_dispatch_llama");
  static const bool made = [] {
    auto r = test::run_kvevict("make-random-model --out " + dir.path() +
                               " --layers 2 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1024 --vocab 600"
                               " --max-positions 128");
    if (r.exit_code != 0) throw std::runtime_error("make-random-model failed: " + r.err);
    return true;
  }();
  (void)made;
  return dir.path();
}

}  // namespace

TEST_CASE("every hand-written kernel's dispatcher refuses a tensor off the CPU or takes ATen's path", "[device]") {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    INFO("dtype " << dtype);
    const auto weight = meta({512, 512}, dtype), row = meta({1, 512}, dtype), rows = meta({4, 512}, dtype);
    CHECK_FALSE(matvec_supported(weight, row));
    CHECK_FALSE(matvec_supported(weight, rows));
    const auto projected = tiled_linear(meta({300, 512}, dtype), weight);
    CHECK(projected.device().is_meta());
    CHECK(projected.sizes() == at::IntArrayRef({300, 512}));

    const auto x = meta({3, 8, 64}, dtype), cos = meta({3, 1, 64}, dtype), sin = meta({3, 1, 64}, dtype);
    CHECK_FALSE(fused_elementwise_supported(x, cos));
    CHECK(rms_norm(meta({3, 512}, dtype), meta({512}, dtype), 1e-5).device().is_meta());
    CHECK(rotate_half(x, cos, sin, 64).device().is_meta());
    const auto silu = elementwise_in_chunks(meta({40000}, dtype), [](const torch::Tensor& c) { return torch::silu(c); });
    CHECK(silu.device().is_meta());
    CHECK(silu.numel() == 40000);

    const auto q = meta({1, 8, 64}, dtype), keys = meta({4, 32, 64}, dtype), values = meta({4, 32, 64}, dtype);
    CHECK_FALSE(single_query_supported(q, keys, values));
  }
  auto logits = meta({8, 16, 40});
  CHECK_FALSE(causal_softmax_in_place(logits, CausalRows{24, 16, 0}));
  const auto probs = causal_softmax(meta({8, 16, 40}), CausalRows{24, 16, 0});
  CHECK(probs.device().is_meta());
  CHECK(probs.sizes() == at::IntArrayRef({8, 16, 40}));
}

TEST_CASE("a model on the meta device runs the decoder's whole pass and a batch's step without a CPU kernel",
          "[device]") {
  ModelOptions options;
  options.shapes_only = true;
  for (const std::string dtype : {"float32", "bfloat16"}) {
    INFO("dtype " << dtype);
    options.dtype = dtype;
    const auto model = Model::load(random_llama_dir(), options);
    REQUIRE(model->device().is_meta());
    const std::vector<int> prompt = test::tokens_of(24, 1, 600);
    FullAttention full;
    const auto logits = model->forward(prompt, 0, full);
    CHECK(logits.device().is_meta());
    CHECK(logits.sizes() == at::IntArrayRef({24, 600}));

    // A decode cache without a policy: the prefill as a block, then two sequences' steps
    // in one forward_batch (each decode row's projection, the batch's one product).
    const auto policy = make_policy(reference_policy_name(), PolicyOptions{});
    std::vector<std::unique_ptr<CacheAttention>> caches;
    for (int i = 0; i < 2; ++i) {
      caches.push_back(std::make_unique<CacheAttention>(*model, *policy, shape_for(*model, 30, 24)));
      CHECK(model->forward(prompt, 0, *caches.back()).device().is_meta());
    }
    for (int step = 0; step < 2; ++step) {
      std::vector<BatchSegment> segments;
      for (auto& cache : caches) segments.push_back(BatchSegment{{5 + step}, 24 + step, cache.get()});
      const auto out = model->forward_batch(segments);
      REQUIRE(out.size() == 2);
      for (const auto& part : out) {
        CHECK(part.device().is_meta());
        CHECK(part.sizes() == at::IntArrayRef({1, 600}));
      }
    }
  }
}

TEST_CASE("a device run's scorer reads the log-probs with tensor ops as the CPU reads them in place", "[device]") {
  torch::manual_seed(7);
  const int T = 37, vocab = 50;
  // Ties: a few rows with repeated values, so the top-k's order rule is exercised.
  auto logits = torch::randn({T, vocab}, torch::kFloat32).mul_(3);
  logits.narrow(0, 0, 5).narrow(1, 10, 20).fill_(1.25);
  std::vector<int> tokens(T);
  for (int i = 0; i < T; ++i) tokens[i] = (i * 13 + 5) % vocab;
  const int top_k = 6, final_target = 9;
  const auto logprobs = torch::log_softmax(logits.to(torch::kFloat64), -1).contiguous();
  const auto acc = logprobs.accessor<double, 2>();

  SequenceScore read;
  read.next_token_logprob.assign(T - 1, std::numeric_limits<double>::quiet_NaN());
  read.top.resize(T);
  for (int r0 = 0; r0 < T; r0 += 16)
    read_logprob_rows(logprobs.narrow(0, r0, std::min(16, T - r0)), r0, tokens, final_target, top_k, read);

  REQUIRE(read.next_token_logprob.size() == static_cast<size_t>(T));
  for (int i = 0; i < T; ++i) {
    INFO("row " << i);
    const int target = i + 1 < T ? tokens[i + 1] : final_target;
    CHECK(read.next_token_logprob[i] == acc[i][target]);
    const auto expected = top_logprobs(&acc[i][0], vocab, top_k);
    REQUIRE(read.top[i].size() == expected.size());
    for (size_t j = 0; j < expected.size(); ++j) {
      CHECK(read.top[i][j].token == expected[j].token);
      CHECK(read.top[i][j].logprob == expected[j].logprob);
    }
  }
}

TEST_CASE("a sim-only policy refuses a sequence whose [heads, T, T] layer matrix is over its limit", "[device]") {
  const Model& model = test::stories();
  PolicyOptions options;
  options.budget.ratio = 0.5;
  const auto sim_only = make_policy("h2o-paper", options);
  REQUIRE_FALSE(sim_only->realisable());
  // The longest sequence under the limit, and one token more.
  const int64_t heads = model.arch().n_heads;
  int length = 1;
  while (heads * int64_t{length + 1} * (length + 1) * 4 <= kSimOnlyLayerBytesMax) ++length;
  CHECK_NOTHROW(SimAttention(model, *sim_only, shape_for(model, length, 0)));
  const std::string refused = test::error_of([&] { SimAttention(model, *sim_only, shape_for(model, length + 1, 0)); });
  CHECK_THAT(refused, Catch::StartsWith("policy h2o-paper is sim-only: each layer holds a [heads, T, T] float32 matrix"));
  CHECK_THAT(refused, Catch::Contains("over the 16 GiB allowed"));
  // A realisable policy's pass is blocked and has no such limit.
  const auto realisable = make_policy("h2o", options);
  CHECK_NOTHROW(SimAttention(model, *realisable, shape_for(model, length + 1, 0)));
}
