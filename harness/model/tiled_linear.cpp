#include "harness/model/tiled_linear.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "harness/model/threads.h"

namespace kvevict {
namespace {

// Multiply-adds below which a tile is not worth handing to another thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 18;

// One tile's product x [t, in] @ weight [cols, in]^T -> [t, cols], on the calling thread.
torch::Tensor tile_product(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  BlasOnThisThread one_thread;
  const auto type = x.scalar_type();
  if (x.size(0) == 1 && (type == torch::kFloat32 || type == torch::kFloat64)) {
    auto y = bias.defined() ? torch::addmv(bias, weight, x[0]) : torch::mv(weight, x[0]);
    return y.unsqueeze(0);
  }
  if (type == torch::kFloat16) {
    // LibTorch's CPU matmul has no float16 kernel: float16 operands widen exactly to
    // float32, the products accumulate there, and the result is rounded to float16 once.
    const auto wide = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat32) : t; };
    return torch::linear(wide(x), wide(weight), wide(bias)).to(torch::kFloat16);
  }
  return torch::linear(x, weight, bias);
}

}  // namespace

torch::Tensor tiled_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!x.device().is_cpu() || x.dim() != 2 || weight.dim() != 2) return torch::linear(x, weight, bias);
  const int64_t t = x.size(0), in = x.size(1), out = weight.size(0);
  if (out <= kLinearTileOutputs) return tile_product(x, weight, bias);
  auto y = torch::empty({t, out}, x.options().dtype(at::result_type(x, weight)));  // [t, out]
  const int64_t tiles = (out + kLinearTileOutputs - 1) / kLinearTileOutputs;
  const int64_t grain = std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(1, t * in * kLinearTileOutputs));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t first = i * kLinearTileOutputs, cols = std::min(kLinearTileOutputs, out - first);
      const torch::Tensor tile_bias = bias.defined() ? bias.narrow(0, first, cols) : bias;
      y.narrow(1, first, cols).copy_(tile_product(x, weight.narrow(0, first, cols), tile_bias));
    }
  });
  return y;
}

}  // namespace kvevict
