// The model's projections (harness/model/tiled_linear.h): torch::linear's values, with
// bits that do not depend on the thread count, on any OpenBLAS kernel.
#include <ATen/Parallel.h>

#include "harness/model/threads.h"
#include "harness/model/tiled_linear.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::ThreadCountGuard;
using kvevict::test::same_bits;

namespace {

std::vector<double> values(const torch::Tensor& t) {
  const auto c = t.to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Bitwise equality (NaN never appears here: the inputs are finite and small).
}  // namespace

TEST_CASE("tiled_linear gives the same bits on 1, 2 and 3 threads and torch::linear's values", "[threads][linear]") {
  ThreadCountGuard guard;
  torch::manual_seed(21);
  struct Shape {
    int64_t rows, in, out;
  };
  // One tile, a tile and a bit, many tiles; one row (mv) and many (sgemm); K of 8
  // (where the Haswell kernel happens not to differ) and of 64 and more.
  const Shape shapes[] = {{400, 64, 64}, {400, 64, 300}, {400, 64, 1100}, {1, 172, 1100}, {37, 8, 600}, {130, 300, 520}};
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16}) {
    for (const Shape& s : shapes) {
      for (bool with_bias : {false, true}) {
        INFO("dtype " << c10::toString(dtype) << " rows " << s.rows << " in " << s.in << " out " << s.out << " bias "
                      << with_bias);
        const auto x = torch::randn({s.rows, s.in}).to(dtype);
        const auto weight = (torch::randn({s.out, s.in}) * 0.1).to(dtype);
        const auto bias = with_bias ? torch::randn({s.out}).to(dtype) : torch::Tensor();
        set_thread_count(1);
        const auto one = tiled_linear(x, weight, bias);
        set_thread_count(2);
        const auto two = tiled_linear(x, weight, bias);
        set_thread_count(3);
        const auto three = tiled_linear(x, weight, bias);
        CHECK(same_bits(one, two));
        CHECK(same_bits(one, three));
        // The same values in float64 (LibTorch's CPU matmul has no float16 kernel).
        const auto wide = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat64) : t; };
        const auto library = torch::linear(wide(x), wide(weight), wide(bias));
        REQUIRE(library.sizes() == one.sizes());
        CHECK(one.scalar_type() == dtype);
        const double scale = library.abs().max().item<double>();
        // Rounding the result to the dtype (bfloat16 2^-8, float16 2^-11 relative) plus the
        // sums' own rounding in float32, relative to the largest output.
        const double tolerance = dtype == torch::kBFloat16   ? 1.0 / 128
                                 : dtype == torch::kFloat16 ? 1.0 / 1024
                                 : dtype == torch::kFloat32 ? 1e-5
                                                            : 1e-12;
        CHECK(test::max_diff(values(one), values(library)) <= tolerance * scale);
      }
    }
  }
}

TEST_CASE("BlasOnThisThread: OpenBLAS's product inside it is the one-thread product", "[threads][linear]") {
  // Outside a parallel region OpenBLAS splits a product over OpenMP's thread count; in the
  // guard's scope that count is 1 for this thread, and after it the count is back.
  ThreadCountGuard guard;
  torch::manual_seed(22);
  const auto x = torch::randn({400, 64}), weight = torch::randn({512, 64});
  set_thread_count(1);
  const auto alone = torch::linear(x, weight);
  set_thread_count(2);
  torch::Tensor guarded;
  {
    BlasOnThisThread one_thread;
    CHECK(at::get_num_threads() == 1);
    guarded = torch::linear(x, weight);
  }
  CHECK(at::get_num_threads() == 2);
  CHECK(same_bits(alone, guarded));
}

TEST_CASE("thread-count determinism also holds on OpenBLAS's Haswell kernels (child process)", "[linear][can-skip]") {
  // OpenBLAS picks its kernels once per process from the CPU (or OPENBLAS_CORETYPE). On an
  // AVX-512 CPU its SkylakeX kernels happen to give split products the same bits, so this
  // reruns the [threads] cases with the kernels of every AVX2 CPU without AVX-512.
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    KVEVICT_SKIP("this CPU has no AVX2 and FMA: OpenBLAS cannot run its Haswell kernels here");
    return;
  }
  const auto child = test::run_command("OPENBLAS_CORETYPE=Haswell " + test::self_binary() + " \"[threads]\" -w NoAssertions");
  INFO(child.out << child.err);
  CHECK(child.exit_code == 0);
  CHECK_THAT(child.out, Catch::Contains("All tests passed"));
  CHECK_THAT(child.out, !Catch::Contains("kvevict test skipped"));
}
