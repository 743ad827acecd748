// RMSNorm and rotate-half RoPE as one loop each (harness/model/fused_elementwise.h):
// the same bits as their ATen expressions, for every shape the decoder gives them.
#include <ATen/Parallel.h>

#include "harness/model/fused_elementwise.h"
#include "harness/model/threads.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::ThreadCountGuard;
using kvevict::test::same_bits;

namespace {

// Normal values over several scales, so bfloat16 rounds in every way: rows of tiny,
// ordinary and large magnitudes.
torch::Tensor spread_values(at::IntArrayRef shape, torch::ScalarType dtype) {
  auto x = torch::randn(shape);
  auto scale = torch::pow(10.0, torch::randint(-3, 4, {x.size(0)}).to(torch::kFloat64)).to(torch::kFloat32);
  std::vector<int64_t> view(shape.size(), 1);
  view[0] = x.size(0);
  return (x * scale.view(view)).to(dtype);
}

}  // namespace

TEST_CASE("fused RMSNorm has the bits of the ATen expression", "[fused]") {
  ThreadCountGuard guard;
  torch::manual_seed(5);
  // A decode row, odd widths, a block of rows (split over threads), per-head q/k norms.
  const std::vector<std::vector<int64_t>> shapes = {{1, 768}, {1, 301}, {257, 300}, {7, 5, 64}};
  for (int threads : {1, 2}) {
    set_thread_count(threads);
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (const auto& shape : shapes) {
        for (double eps : {1e-6, 1e-5}) {
          INFO("threads " << threads << " dtype " << dtype << " shape " << torch::IntArrayRef(shape) << " eps " << eps);
          auto x = spread_values(shape, dtype);
          auto w = torch::randn({shape.back()}).to(dtype);
          REQUIRE(fused_elementwise_supported(x, w));
          auto fused = rms_norm_fused(x, w, eps);
          CHECK(same_bits(fused, rms_norm_aten(x, w, eps)));
          CHECK(same_bits(rms_norm(x, w, eps), fused));
        }
      }
    }
  }
  // ATen sums a transposed row in another order than a contiguous one, so such an input
  // keeps ATen's ops.
  auto x = torch::randn({300, 9}).t();
  auto w = torch::randn({300});
  CHECK(same_bits(rms_norm(x, w, 1e-6), rms_norm_aten(x, w, 1e-6)));
}

TEST_CASE("fused rotate-half RoPE has the bits of the ATen expression", "[fused]") {
  ThreadCountGuard guard;
  torch::manual_seed(6);
  struct Case {
    int64_t t, heads, head_dim, rotary_dim;
    bool strided;  // q, k or v as a slice of a fused per-head QKV projection
  };
  const Case cases[] = {{1, 12, 64, 64, false},  {1, 12, 64, 64, true},  {9, 5, 32, 8, false},
                        {9, 5, 32, 8, true},     {300, 12, 64, 64, false}, {3, 2, 96, 32, false}};
  for (int threads : {1, 2}) {
    set_thread_count(threads);
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (const Case& c : cases) {
        INFO("threads " << threads << " dtype " << dtype << " t " << c.t << " heads " << c.heads << " head_dim "
                        << c.head_dim << " rotary_dim " << c.rotary_dim << " strided " << c.strided);
        torch::Tensor x = c.strided ? spread_values({c.t, c.heads, 3 * c.head_dim}, dtype).narrow(2, c.head_dim, c.head_dim)
                                    : spread_values({c.t, c.heads, c.head_dim}, dtype);
        // cos and sin as the decoder makes them: float32 angles of positions 40.., then the dtype.
        auto inv_freq = torch::pow(10000.0, -torch::arange(0, c.rotary_dim, 2, torch::kFloat64) / c.rotary_dim)
                            .to(torch::kFloat32);
        auto freqs = torch::outer(torch::arange(40, 40 + c.t, torch::kFloat32), inv_freq);
        auto emb = torch::cat({freqs, freqs}, -1);
        auto cos = emb.cos().unsqueeze(1).to(dtype), sin = emb.sin().unsqueeze(1).to(dtype);
        REQUIRE(fused_elementwise_supported(x, cos));
        auto fused = rotate_half_fused(x, cos, sin, c.rotary_dim);
        CHECK(fused.is_contiguous());
        CHECK(same_bits(fused, rotate_half_aten(x, cos, sin, c.rotary_dim)));
        CHECK(same_bits(rotate_half(x, cos, sin, c.rotary_dim), fused));
      }
    }
  }
}

TEST_CASE("other dtypes and shapes keep the ATen expressions", "[fused]") {
  auto w = torch::randn({16});
  CHECK_FALSE(fused_elementwise_supported(torch::randn({2, 16}, torch::kFloat64), w.to(torch::kFloat64)));
  CHECK_FALSE(fused_elementwise_supported(torch::randn({2, 16}).to(torch::kFloat16), w.to(torch::kFloat16)));
  CHECK_FALSE(fused_elementwise_supported(torch::randn({2, 16}), w.to(torch::kBFloat16)));
  // float64 reference runs go through ATen and still compute.
  auto x64 = torch::randn({2, 16}, torch::kFloat64);
  CHECK(torch::equal(rms_norm(x64, w.to(torch::kFloat64), 1e-6), rms_norm_aten(x64, w.to(torch::kFloat64), 1e-6)));
  // One row of angles for several tokens is ATen's broadcast, not the loops' [t, rotary_dim].
  auto x = torch::randn({3, 2, 8});
  auto cos = torch::randn({1, 1, 8}), sin = torch::randn({1, 1, 8});
  CHECK(torch::equal(rotate_half(x, cos, sin, 8), rotate_half_aten(x, cos, sin, 8)));
}
