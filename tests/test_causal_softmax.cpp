// The causal softmax that skips hidden keys (harness/runtime/causal_softmax.h): the same
// bits as hiding them with -inf and running torch::softmax over whole rows.
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "harness/model/threads.h"
#include "harness/runtime/causal_softmax.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::ThreadCountGuard;

namespace {

// Equal bit patterns, with a NaN matching any NaN: which NaN a multiply of two NaNs
// returns follows the operand order the compiler picks for a commutative op (ATen's
// release build and this project's -O1 sanitizer build pick differently), not the
// arithmetic. Every other value, -0 and +0 included, must match bit for bit.
bool same_bits_and_nans(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  const auto a_nan = torch::isnan(a), b_nan = torch::isnan(b);
  return torch::equal(a_nan, b_nan) && torch::equal(a.masked_fill(a_nan, 0).contiguous().view(torch::kInt32),
                                                    b.masked_fill(b_nan, 0).contiguous().view(torch::kInt32));
}

// The loop's answer (taken wherever ATen runs its AVX2 kernels) against ATen's, on
// copies of the same logits.
void check_against_aten(const torch::Tensor& logits, const CausalRows& mask) {
  auto loop = logits.clone(), aten = logits.clone();
  REQUIRE(causal_softmax_in_place(loop, mask));
  const auto expected = causal_softmax_aten(aten, mask);
  CHECK(same_bits_and_nans(loop, expected));
}

constexpr const char* kNotOnAvx2 =
    "ATen does not run its AVX2 kernels in this process (the CPU or ATEN_CPU_CAPABILITY chose others), so "
    "the loop is never taken here; 'causal softmax's AVX2 loop is checked in a child process' runs it";

// The values of a tensor, as doubles.
std::vector<double> values(const torch::Tensor& t) {
  const auto c = t.to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

}  // namespace

// The two [causal-loop] cases check the loop; they need ATen on its AVX2 kernels.
TEST_CASE("causal softmax has the bits of masking and torch::softmax", "[attention][causal-loop][can-skip]") {
  if (!aten_uses_avx2_kernels()) {
    KVEVICT_SKIP(kNotOnAvx2);
    return;
  }
  ThreadCountGuard guard;
  torch::manual_seed(11);
  struct Case {
    int64_t heads, rows, n, window;
  };
  // Rows per block and keys as the attention backends make them (keys end at the last
  // query, n >= rows): rows shorter than one vector, at and around 8-element chunk
  // boundaries, a prefill continuing a cache (n > rows), long rows split over threads,
  // and sliding windows.
  const Case cases[] = {{1, 1, 1, 0},    {4, 5, 5, 0},     {4, 7, 7, 0},     {2, 8, 8, 0},    {2, 9, 9, 0},
                        {8, 17, 17, 0},  {3, 24, 24, 0},   {6, 100, 100, 0}, {2, 3, 40, 0},   {3, 16, 1030, 0},
                        {12, 170, 1024, 0}, {4, 64, 64, 5}, {2, 50, 90, 16},  {2, 9, 9, 1}};
  for (int threads : {1, 2}) {
    set_thread_count(threads);
    for (const Case& c : cases) {
      for (double scale : {0.1, 1.0, 30.0, 1000.0}) {  // soft, ordinary, peaked, underflowing
        INFO("threads " << threads << " heads " << c.heads << " rows " << c.rows << " n " << c.n << " window "
                        << c.window << " scale " << scale);
        auto logits = torch::randn({c.heads, c.rows, c.n}) * scale;
        check_against_aten(logits, CausalRows{c.n - c.rows, c.rows, c.window});
      }
    }
  }
}

TEST_CASE("causal softmax rows with an infinite or NaN logit run whole, as ATen's do", "[attention][causal-loop][can-skip]") {
  if (!aten_uses_avx2_kernels()) {
    KVEVICT_SKIP(kNotOnAvx2);
    return;
  }
  torch::manual_seed(12);
  const float inf = std::numeric_limits<float>::infinity();
  for (float odd : {inf, -inf, std::nanf("")}) {
    for (int64_t n : {5, 20}) {
      INFO("value " << odd << " n " << n);
      auto logits = torch::randn({2, n, n});
      auto a = logits.accessor<float, 3>();
      a[0][n - 1][0] = odd;  // a visible key of the last row
      a[1][1][1] = odd;      // the diagonal of an early row, whose other keys are hidden
      a[1][0][0] = odd;      // a row's only visible key
      check_against_aten(logits, CausalRows{0, n, 0});
    }
  }
}

TEST_CASE("causal softmax leaves other dtypes and layouts to ATen", "[attention]") {
  auto doubles = torch::randn({2, 4, 4}, torch::kFloat64);
  CHECK_FALSE(causal_softmax_in_place(doubles, CausalRows{0, 4, 0}));
  auto strided = torch::randn({2, 4, 8}).narrow(2, 0, 4);
  CHECK_FALSE(causal_softmax_in_place(strided, CausalRows{0, 4, 0}));
  // causal_softmax() takes them through ATen, hidden keys at +0.
  auto probs = causal_softmax(doubles.clone(), CausalRows{0, 4, 0});
  CHECK(probs.scalar_type() == torch::kFloat64);
  CHECK(probs[0][0][1].item<double>() == 0.0);
  CHECK((probs.sum(-1) - 1).abs().max().item<double>() < 1e-12);
}

TEST_CASE("causal softmax's AVX2 loop is checked in a child process on any AVX2 CPU", "[attention][can-skip]") {
  // ATen reads ATEN_CPU_CAPABILITY once per process; on an AVX-512 machine (or under
  // ATEN_CPU_CAPABILITY=default) the [causal-loop] cases skip in this one.
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    KVEVICT_SKIP("this CPU has no AVX2 and FMA, so ATen never runs its AVX2 kernels and the loop is never taken");
    return;
  }
  const auto child = test::run_command("ATEN_CPU_CAPABILITY=avx2 " + test::self_binary() +
                                       " \"[causal-loop]\" -w NoAssertions");
  INFO(child.out << child.err);
  CHECK(child.exit_code == 0);
  CHECK_THAT(child.out, Catch::Contains("All tests passed") && Catch::Contains("in 2 test cases"));
  CHECK_THAT(child.out, !Catch::Contains("kvevict test skipped"));
}

TEST_CASE("causal softmax on any CPU: hidden keys +0, visible ones the float64 softmax", "[attention]") {
  // Whichever path runs here (the loop or ATen's softmax), and the loop's contract: taken
  // exactly where ATen runs its AVX2 kernels, and leaving the block as it was when not.
  torch::manual_seed(13);
  for (const CausalRows mask : {CausalRows{0, 9, 0}, CausalRows{31, 9, 0}, CausalRows{0, 40, 7}}) {
    const int64_t n = mask.first_query + mask.rows;
    INFO("first query " << mask.first_query << " rows " << mask.rows << " window " << mask.window);
    const auto logits = torch::randn({3, mask.rows, n}) * 4;
    auto block = logits.clone();
    const bool taken = causal_softmax_in_place(block, mask);
    CHECK(taken == aten_uses_avx2_kernels());
    if (!taken) CHECK(torch::equal(block, logits));
    const auto probs = causal_softmax(logits.clone(), mask);
    // The reference: float64, hidden keys dropped by hand.
    auto reference = torch::zeros({3, mask.rows, n}, torch::kFloat64);
    const auto l = logits.to(torch::kFloat64);
    for (int64_t r = 0; r < mask.rows; ++r) {
      const int64_t query = mask.first_query + r;
      const int64_t first = mask.window > 0 ? std::max<int64_t>(0, query - mask.window + 1) : 0;
      const auto visible = l.select(1, r).narrow(1, first, query - first + 1);
      reference.select(1, r).narrow(1, first, query - first + 1).copy_(torch::softmax(visible, -1));
    }
    CHECK(test::max_diff(values(probs), values(reference)) < 1e-6);
    // Hidden keys are exactly +0, not merely small.
    CHECK(torch::equal(probs.masked_select(reference == 0), torch::zeros({reference.eq(0).sum().item<int64_t>()})));
  }
}
