// The one-row decode kernel (harness/model/matvec.h) and the bandwidth probe it is
// measured against (harness/runtime/roofline.h). Values only: speed lives in the bench.
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "harness/common/errors.h"
#include "harness/model/matvec.h"
#include "harness/model/model.h"
#include "harness/model/threads.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/roofline.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::ThreadCountGuard;

namespace {

// Restores the process's thread count when a test changed it.
// Odd sizes, so the vector loops' tails run; 1001 rows of 300 float32 split into
// several chunks (the kernel hands out at least 128 KiB of weights per thread).
torch::Tensor random_weight(torch::ScalarType dtype) {
  torch::manual_seed(11);
  return torch::randn({1001, 300}).to(dtype);
}

}  // namespace

TEST_CASE("matvec equals the float64 product of the same values", "[matvec]") {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto weight = random_weight(dtype);
    auto x = torch::randn({300}).to(dtype);
    auto bias = torch::randn({1001}).to(dtype);
    REQUIRE(matvec_supported(weight, x, bias));
    auto exact = torch::addmv(bias.to(torch::kFloat64), weight.to(torch::kFloat64), x.to(torch::kFloat64));
    auto y = matvec(weight, x, bias);
    REQUIRE(y.scalar_type() == dtype);
    REQUIRE(y.sizes() == exact.sizes());
    const double error = (y.to(torch::kFloat64) - exact).abs().max().item<double>();
    // float32: summation error of 300 terms; bfloat16: one rounding of the output (8 bits).
    const double scale = exact.abs().max().item<double>();
    CHECK(error <= (dtype == torch::kFloat32 ? 1e-5 : 1.0 / 128) * scale);
    // Without the bias, too.
    auto plain = matvec(weight, x);
    auto exact_plain = torch::mv(weight.to(torch::kFloat64), x.to(torch::kFloat64));
    CHECK((plain.to(torch::kFloat64) - exact_plain).abs().max().item<double>() <=
          (dtype == torch::kFloat32 ? 1e-5 : 1.0 / 128) * exact_plain.abs().max().item<double>());
  }
}

TEST_CASE("matvec gives the same bits on one thread and on two", "[matvec][threads]") {
  ThreadCountGuard guard;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto weight = random_weight(dtype);
    auto x = torch::randn({300}).to(dtype);
    set_thread_count(1);
    auto one = matvec(weight, x);
    set_thread_count(2);
    auto two = matvec(weight, x);
    CHECK(torch::equal(one, two));
  }
}

TEST_CASE("matvec takes a decode step's row [1, in] and gives [1, out] with the same bits", "[matvec]") {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto weight = random_weight(dtype);
    auto x = torch::randn({300}).to(dtype);
    auto bias = torch::randn({1001}).to(dtype);
    REQUIRE(matvec_supported(weight, x.unsqueeze(0), bias));
    auto row = matvec(weight, x.unsqueeze(0), bias);
    REQUIRE(row.sizes() == torch::IntArrayRef({1, 1001}));
    CHECK(torch::equal(row[0], matvec(weight, x, bias)));
  }
  CHECK(matvec_supported(torch::randn({8, 4}), torch::randn({2, 4})));          // a batch's rows (test_batching.cpp)
  CHECK_FALSE(matvec_supported(torch::randn({8, 4}), torch::randn({2, 1, 4})));  // three dimensions
}

TEST_CASE("matvec's B rows each have the bits of that row alone, at every batch size and width", "[matvec][batch]") {
  // Widths with and without the 32- and 8-float tails; batches below, at and past the
  // kernel's blocks of 4 x rows; 1001 weight rows, not a multiple of its 3.
  ThreadCountGuard guard;
  torch::manual_seed(12);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (int64_t in : {5, 8, 40, 77, 300, 768}) {
      auto weight = torch::randn({1001, in}).to(dtype);
      auto bias = torch::randn({1001}).to(dtype);
      auto x = torch::randn({13, in}).to(dtype);
      for (int threads : {1, 2}) {
        set_thread_count(threads);
        for (int64_t batch : {1, 2, 3, 4, 5, 7, 8, 9, 13}) {
          INFO("dtype " << dtype << " in " << in << " batch " << batch << " threads " << threads);
          auto together = matvec(weight, x.narrow(0, 0, batch), bias);
          for (int64_t b = 0; b < batch; ++b) CHECK(test::same_bits(together[b], matvec(weight, x[b], bias)));
        }
      }
    }
}

TEST_CASE("matvec_each gives each weight matvec()'s bits, on one thread and on two", "[matvec][threads]") {
  // q, k, v-like: three heights (none a multiple of a block's rows), biases on two, one
  // pass whose blocks the threads take as they come.
  ThreadCountGuard guard;
  torch::manual_seed(13);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const std::vector<Linear> linears = {{torch::randn({1001, 300}).to(dtype), torch::randn({1001}).to(dtype)},
                                         {torch::randn({257, 300}).to(dtype), {}},
                                         {torch::randn({7, 300}).to(dtype), torch::randn({7}).to(dtype)}};
    auto x = torch::randn({13, 300}).to(dtype);
    for (int threads : {1, 2}) {
      set_thread_count(threads);
      for (int64_t batch : {1, 4, 13}) {
        INFO("dtype " << dtype << " batch " << batch << " threads " << threads);
        const auto rows = x.narrow(0, 0, batch);
        const auto each = matvec_each(linears, rows);
        REQUIRE(each.size() == linears.size());
        for (size_t i = 0; i < linears.size(); ++i)
          CHECK(test::same_bits(each[i], matvec(linears[i].weight, rows, linears[i].bias)));
        const auto one_row = matvec_each(linears, x[0]);
        for (size_t i = 0; i < linears.size(); ++i)
          CHECK(test::same_bits(one_row[i], matvec(linears[i].weight, x[0], linears[i].bias)));
      }
    }
  }
  // A group whose weights differ in width or dtype is refused.
  CHECK_THROWS_AS(matvec_each({{torch::randn({8, 4}), {}}, {torch::randn({8, 5}), {}}}, torch::randn({4})), Error);
  CHECK_THROWS_AS(matvec_each({{torch::randn({8, 4}), {}}, {torch::randn({8, 4}).to(torch::kBFloat16), {}}},
                              torch::randn({4})),
                  Error);
}

TEST_CASE("matvec's AVX-512 kernel gives the AVX2 kernel's bits", "[matvec][batch][can-skip]") {
  if (matvec_isa() < MatvecIsa::Avx512) {
    KVEVICT_SKIP("this CPU (or ATEN_CPU_CAPABILITY) runs no AVX-512 kernel here");
    return;
  }
  struct Restore {
    ~Restore() { limit_matvec_isa(MatvecIsa::Avx512Bf16); }
  } restore;
  // 17 and 40 rows: the six-row block, with a remainder group; 1000 wide: its columns in
  // chunks (and more than one chunk's worth of x rows at 40), with an 8-float tail.
  torch::manual_seed(13);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (int64_t in : {5, 8, 40, 77, 300, 768, 1000}) {
      auto weight = torch::randn({1001, in}).to(dtype);
      auto bias = torch::randn({1001}).to(dtype);
      auto x = torch::randn({40, in}).to(dtype);
      for (int64_t batch : {1, 3, 4, 5, 8, 13, 17, 40}) {
        INFO("dtype " << dtype << " in " << in << " batch " << batch);
        limit_matvec_isa(MatvecIsa::Avx512);
        auto wide = matvec(weight, x.narrow(0, 0, batch), bias);
        limit_matvec_isa(MatvecIsa::Avx2);
        REQUIRE(matvec_isa() == MatvecIsa::Avx2);
        auto narrow = matvec(weight, x.narrow(0, 0, batch), bias);
        CHECK(test::same_bits(wide, narrow));
      }
    }
}

namespace {

// The bfloat16 order matvec.cpp documents, written out here on its own: sixteen lane sums,
// lane j adding the products of elements 32c+2j+1 and 32c+2j of each chunk c in that
// order (a missing element of the last chunk adds +0), then lanes folded j+8, j+4, j+2, 1.
std::vector<float> matvec_bf16_pair_order(const torch::Tensor& weight, const torch::Tensor& x_row,
                                          const torch::Tensor& bias) {
  const auto w = weight.to(torch::kFloat32).contiguous(), x = x_row.to(torch::kFloat32).contiguous();
  const auto b = bias.to(torch::kFloat32).contiguous();
  const int64_t out = w.size(0), n = w.size(1);
  const float* wp = w.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  std::vector<float> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    float lane[16] = {};
    for (int64_t c = 0; c < n; c += 32)
      for (int j = 0; j < 16; ++j)
        for (int64_t e : {c + 2 * j + 1, c + 2 * j}) lane[j] += e < n ? wp[o * n + e] * xp[e] : 0.0f;
    float s8[8], s4[4];
    for (int j = 0; j < 8; ++j) s8[j] = lane[j] + lane[j + 8];
    for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
    const float sum = (s4[0] + s4[2]) + (s4[1] + s4[3]) + b.data_ptr<float>()[o];
    y[static_cast<size_t>(o)] = c10::BFloat16(sum);  // rounded once, to nearest even
  }
  return y;
}

}  // namespace

TEST_CASE("bfloat16 matvec sums in vdpbf16ps's pair order on every kernel this CPU has", "[matvec][batch]") {
  struct Restore {
    ~Restore() {
      limit_matvec_isa(MatvecIsa::Avx512Bf16);
      prefer_bf16_dot(false);
    }
  } restore;
  prefer_bf16_dot(true);  // vdpbf16ps where the CPU has it, even where FMAs outrun it
  std::vector<MatvecIsa> levels;
  for (auto isa : {MatvecIsa::Avx512Bf16, MatvecIsa::Avx512, MatvecIsa::Avx2, MatvecIsa::Portable}) {
    limit_matvec_isa(isa);
    if (matvec_isa() == isa) levels.push_back(isa);
  }
  REQUIRE(!levels.empty());
  torch::manual_seed(14);
  // 2000 wide from 5 rows of x on: the column chunks, and more than one chunk's worth of x rows at 40.
  for (int64_t in : {5, 31, 32, 33, 77, 300, 768, 2000}) {
    auto weight = torch::randn({203, in}).to(torch::kBFloat16);
    auto bias = torch::randn({203}).to(torch::kBFloat16);
    auto x = torch::randn({40, in}).to(torch::kBFloat16);
    std::vector<std::vector<float>> expected;
    for (int64_t b = 0; b < 40; ++b) expected.push_back(matvec_bf16_pair_order(weight, x[b], bias));
    for (auto isa : levels) {
      limit_matvec_isa(isa);
      for (int64_t batch : {1, 4, 9, 17, 40}) {
        INFO("isa " << int(isa) << " in " << in << " batch " << batch);
        auto y = matvec(weight, x.narrow(0, 0, batch), bias).to(torch::kFloat32).contiguous();
        int64_t mismatches = 0;
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t o = 0; o < 203; ++o)
            mismatches += std::memcmp(&y.data_ptr<float>()[b * 203 + o], &expected[b][o], sizeof(float)) != 0;
        CHECK(mismatches == 0);
      }
    }
  }
}

TEST_CASE("matvec refuses what it does not handle, by name", "[matvec]") {
  auto half = torch::randn({8, 4}).to(torch::kFloat16);
  CHECK_FALSE(matvec_supported(half, torch::randn({4}).to(torch::kFloat16)));
  CHECK_FALSE(matvec_supported(torch::randn({8, 4}), torch::randn({4}).to(torch::kBFloat16)));  // mixed
  CHECK_FALSE(matvec_supported(torch::randn({4, 8}).t(), torch::randn({4})));                  // not contiguous
  CHECK_FALSE(matvec_supported(torch::randn({8, 4}), torch::randn({5})));                       // wrong width
  CHECK_FALSE(matvec_supported(torch::randn({8, 4}), torch::randn({4}), torch::randn({7})));    // wrong bias
  CHECK_THROWS_AS(matvec(half, torch::randn({4}).to(torch::kFloat16)), Error);
}

TEST_CASE("the read-bandwidth probe reads with every thread it is given", "[roofline]") {
  // ATen's parallel_for compiles its OpenMP pragma into the caller: built without
  // OpenMP, the probe ran on one thread whatever the thread count.
  ThreadCountGuard guard;
  for (int threads : {1, 2}) {
    set_thread_count(threads);
    const ReadBandwidth read = measure_read_bandwidth(int64_t{16} << 20, 1);
    CHECK(read.threads == threads);
    CHECK(read.bytes_per_s > 0);
  }
}

TEST_CASE("decode through matvec matches the full forward on weights of 1 MiB and more", "[matvec][model]") {
  // hidden 768: every matrix is at least 1 MiB in float32 and in bfloat16, so one-row
  // steps take matvec (the test models are smaller and keep torch::mv / torch::linear).
  const auto dir = test::temp_dir("random_matvec");
  auto r = test::run_kvevict("make-random-model --out " + dir + " --layers 2 --hidden 768 --heads 6 --kv-heads 6"
                             " --intermediate 768 --vocab 700 --max-positions 64");
  REQUIRE(r.exit_code == 0);
  const std::vector<int> tokens = {1, 17, 300, 42, 699, 3, 250, 77};
  auto full_policy = make_policy("full", PolicyOptions{});
  auto decode_logits = [&](const Model& model) {
    CacheAttention cache(model, *full_policy, shape_for(model, static_cast<int>(tokens.size()), 1));
    std::vector<torch::Tensor> rows;
    for (size_t i = 0; i < tokens.size(); ++i)
      rows.push_back(model.forward({tokens[i]}, static_cast<int64_t>(i), cache));
    return torch::cat(rows, 0);
  };
  auto model32 = Model::load(dir);
  FullAttention attention;
  auto reference = model32->forward(tokens, 0, attention);  // all rows at once: torch::linear
  auto decoded32 = decode_logits(*model32);
  REQUIRE(decoded32.sizes() == reference.sizes());
  CHECK((decoded32 - reference).abs().max().item<double>() < 1e-5);
  ModelOptions bf16;
  bf16.dtype = "bfloat16";
  auto decoded16 = decode_logits(*Model::load(dir, bf16));
  const double scale = reference.abs().max().item<double>();
  WARN("bf16 decode vs float32 full forward: max |diff| " << (decoded16 - reference).abs().max().item<double>()
       << " of max |logit| " << scale);
  CHECK((decoded16 - reference).abs().max().item<double>() < 0.05 * scale);
}
