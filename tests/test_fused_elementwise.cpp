// RMSNorm and rotate-half RoPE as one loop each (harness/model/fused_elementwise.h):
// RoPE with the bits of its ATen expression, RMSNorm with those of its expression over an
// exact mean, for every shape the decoder gives them.
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <utility>

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

// ATen's RMSNorm expression with its mean of squares taken in float64 and rounded to
// float: what the fused loop computes, up to the order of its float64 sum.
torch::Tensor rms_norm_float64_mean(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto xf = x.to(torch::kFloat32);
  auto mean = x.to(torch::kFloat64).pow(2).mean(-1, true).to(torch::kFloat32);
  return w * (xf * torch::rsqrt(mean + eps)).to(x.scalar_type());
}

TEST_CASE("fused RMSNorm is ATen's expression with the mean of squares in float64", "[fused]") {
  ThreadCountGuard guard;
  torch::manual_seed(5);
  // A decode row, odd widths, a block of rows (split over threads), per-head q/k norms.
  const std::vector<std::vector<int64_t>> shapes = {{1, 768}, {1, 301}, {257, 300}, {7, 5, 64}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const auto& shape : shapes) {
      for (double eps : {1e-6, 1e-5}) {
        INFO("dtype " << dtype << " shape " << torch::IntArrayRef(shape) << " eps " << eps);
        auto x = spread_values(shape, dtype);
        auto w = torch::randn({shape.back()}).to(dtype);
        REQUIRE(fused_elementwise_supported(x, w));
        set_thread_count(1);
        auto fused = rms_norm_fused(x, w, eps);
        CHECK(same_bits(fused, rms_norm_float64_mean(x, w, eps)));
        CHECK(same_bits(rms_norm(x, w, eps), fused));
        // ATen's float32 sum of squares is off the exact one by a few units in its last
        // place; the output a little more, through the rsqrt and the two products (measured:
        // 2.7 float32 ulps, 0.9 bfloat16 ulps).
        auto aten = rms_norm_aten(x, w, eps).to(torch::kFloat32);
        const double ulps = dtype == torch::kFloat32 ? 4 * std::ldexp(1.0, -23) : 2 * std::ldexp(1.0, -7);
        std::cerr << "maxrel " << ((fused.to(torch::kFloat32) - aten).abs() / aten.abs()).max().item<double>() / ulps << " count " << ((fused.to(torch::kFloat32) - aten).abs() > ulps * aten.abs()).sum().item<int64_t>() << "\n";
      CHECK(((fused.to(torch::kFloat32) - aten).abs() <= ulps * aten.abs()).all().item<bool>());
        // Each row alone, on any thread count, and a strided copy of the rows.
        set_thread_count(2);
        CHECK(same_bits(rms_norm_fused(x, w, eps), fused));
        const auto rows = x.reshape({-1, shape.back()}), fused_rows = fused.reshape({-1, shape.back()});
        for (int64_t r : {int64_t{0}, rows.size(0) / 2, rows.size(0) - 1})
          CHECK(same_bits(rms_norm(rows.narrow(0, r, 1), w, eps), fused_rows.narrow(0, r, 1)));
        auto strided = torch::empty({shape.back(), rows.size(0)}, x.options()).t();
        strided.copy_(rows);
        CHECK(same_bits(rms_norm(strided, w, eps), fused_rows));
      }
    }
  }
}

TEST_CASE("the fused residual sum has ATen's bits and its RMSNorm the fused one's", "[fused]") {
  ThreadCountGuard guard;
  torch::manual_seed(7);
  for (int threads : {1, 2}) {
    set_thread_count(threads);
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 768}, std::vector<int64_t>{300, 129}}) {
        INFO("threads " << threads << " dtype " << dtype << " shape " << torch::IntArrayRef(shape));
        auto x = spread_values(shape, dtype), delta = spread_values(shape, dtype);
        auto w = torch::randn({shape.back()}).to(dtype);
        const auto [sum, normed] = add_rms_norm(x, delta, w, 1e-6);
        CHECK(same_bits(sum, x + delta));
        CHECK(same_bits(normed, rms_norm_fused(x + delta, w, 1e-6)));
      }
    }
  }
  // Operands the loops do not take: ATen's sum and norm.
  auto x64 = torch::randn({2, 16}, torch::kFloat64), w64 = torch::randn({16}, torch::kFloat64);
  const auto [sum, normed] = add_rms_norm(x64, x64, w64, 1e-6);
  CHECK(torch::equal(sum, x64 + x64));
  CHECK(torch::equal(normed, rms_norm_aten(x64 + x64, w64, 1e-6)));
}

TEST_CASE("fused silu(gate) * up is within a few ulps of an exact silu and each element's own", "[fused]") {
  ThreadCountGuard guard;
  torch::manual_seed(8);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    INFO("dtype " << dtype);
    // A decode row of a fused gate-up product (the gate a strided view), and a block.
    auto gate_up = spread_values({1, 2 * 2048}, dtype);
    auto gate = gate_up.narrow(-1, 0, 2048), up = gate_up.narrow(-1, 2048, 2048);
    auto block = spread_values({300, 172}, dtype), block_up = spread_values({300, 172}, dtype);
    REQUIRE(fused_elementwise_supported(gate, up));
    set_thread_count(1);
    for (const auto& [g, u] : {std::make_pair(gate, up), std::make_pair(block, block_up)}) {
      const auto fused = silu_times(g, u);
      REQUIRE(fused.sizes() == g.sizes());
      CHECK_FALSE(torch::isnan(fused).any().item<bool>());
      // Against silu in float64 rounded to the dtype, times up, rounded: the float32 result
      // within a few ulps (our exp is within 1.5 ulp), the bfloat16 one mostly the same and
      // at most one rounding step off (where the float silu lies next to a rounding tie).
      // Below g = -87 (exp(-87) is 2^-125.5) our silu is 0, where the true one is smaller than 1e-34.
      const auto g64 = g.to(torch::kFloat64), u64 = u.to(torch::kFloat64);
      const auto silu64 = (g64 / (1 + torch::exp(-g64))).to(dtype).to(torch::kFloat64);
      const auto reference = (silu64 * u64).to(dtype).to(torch::kFloat64);
      const auto got = fused.to(torch::kFloat64), inside = g64 >= -87;
      REQUIRE(inside.any().item<bool>());
      const double ulps = dtype == torch::kFloat32 ? 4 * std::ldexp(1.0, -23) : 2 * std::ldexp(1.0, -7);
      CHECK(((got - reference).abs() <= ulps * reference.abs()).logical_or(~inside).all().item<bool>());
      CHECK((got.abs() <= 1e-34 * u64.abs()).logical_or(inside).all().item<bool>());
      if (dtype == torch::kBFloat16)
        CHECK((got == reference).masked_select(inside).to(torch::kFloat64).mean().item<double>() >= 0.999);
      // ATen's float32 silu and product likewise (LibTorch 1.13's bfloat16 silu rounds
      // after each of its ops, so it is no reference there).
      if (dtype == torch::kFloat32) {
        const auto aten = (torch::silu(g) * u).to(torch::kFloat64);
        CHECK(((got - aten).abs() <= ulps * aten.abs()).logical_or(~inside).all().item<bool>());
      }
      // Element by element: alone, contiguous, on two threads.
      set_thread_count(2);
      CHECK(same_bits(silu_times(g.contiguous(), u.contiguous()), fused));
      set_thread_count(1);
      const auto flat_g = g.reshape({-1}), flat_u = u.reshape({-1}), flat = fused.reshape({-1});
      for (int64_t i : {int64_t{0}, int64_t{17}, flat_g.size(0) - 1})
        CHECK(same_bits(silu_times(flat_g.narrow(0, i, 1), flat_u.narrow(0, i, 1)), flat.narrow(0, i, 1)));
    }
  }
  // The ends of the range: silu(+inf) = inf, silu of a large negative number is -0 or a
  // tiny negative number, NaN stays NaN.
  const float inf = std::numeric_limits<float>::infinity();
  auto g = torch::tensor({inf, -200.0f, 200.0f, 0.0f, std::nanf("")});
  auto out = silu_times(g, torch::ones({5}));
  CHECK(out[0].item<float>() == inf);
  CHECK(out[1].item<float>() <= 0.0f);
  CHECK(out[1].item<float>() > -1e-30f);
  CHECK(out[2].item<float>() == 200.0f);
  CHECK(out[3].item<float>() == 0.0f);
  CHECK(std::isnan(out[4].item<float>()));
  // float64 takes ATen's silu and product.
  auto g64 = torch::randn({3, 8}, torch::kFloat64), u64 = torch::randn({3, 8}, torch::kFloat64);
  CHECK(torch::equal(silu_times(g64, u64), torch::silu(g64) * u64));
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
