// x @ weight^T (+ bias) whose numbers do not depend on the thread count.
// OpenBLAS splits a product over its threads, and with its Haswell/Zen kernels (every
// AVX2 CPU without AVX-512) an output's bits depend on where the split falls: a
// [400, 64] x [512, 64]^T product differs in 8244 of its 204800 outputs between one
// thread and two. Here the weight's rows are cut into tiles by the shape alone, and each
// tile is one library call on one thread (BlasOnThisThread), so any thread count makes
// the same calls on the same operands.
#pragma once
#include "harness/model/tensor.h"

namespace kvevict {

// Weight rows (outputs) per tile: one library call each.
constexpr int64_t kLinearTileOutputs = 128;

// x [t, in] times weight [out, in]^T (+ bias [out]) -> [t, out], as torch::linear, but on
// the CPU in tiles of kLinearTileOutputs weight rows, the tiles spread over the threads.
// A one-row x in float32 or float64 uses torch::mv / addmv (torch::linear would pack the
// whole weight for one row); float16 multiplies in float32 (LibTorch's CPU matmul has no
// float16 kernel) and rounds the result once. Other devices and shapes: torch::linear.
torch::Tensor tiled_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

}  // namespace kvevict
