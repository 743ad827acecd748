// One-row matrix-vector products for batch-1 decode on the CPU. A decode
// step is bound by reading the weights once; torch::linear on one bf16 row (oneDNN)
// and torch::mv reach about half and two thirds of the read bandwidth here, this
// kernel reaches it: each weight row is one sequential stream, widened to float32 and
// accumulated in float32, and threads split the output rows.
#pragma once
#include "harness/model/tensor.h"

namespace kvevict {

// Whether matvec() takes weight [out, in], a row x ([in] or [1, in]) and bias (undefined
// or [out]) of this kind: on the CPU, all float32 or all bfloat16, contiguous weight and bias.
// Otherwise use torch::linear / torch::mv.
bool matvec_supported(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias = {});

// weight [out, in] times x [in] (+ bias [out]) -> [out] in x's dtype; x [1, in] gives
// [1, out] (a decode step's one row, with no reshaping op around the call). Every output
// is a float32 sum in a fixed order, rounded once to the dtype, so the result does not
// depend on the thread count.
torch::Tensor matvec(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias = {});

}  // namespace kvevict
