// Matrix-vector products for decode steps on the CPU: one row (batch 1) or the B rows of a
// batched step, each weight row read once for all of them. A decode
// step is bound by reading the weights once; torch::linear on one bf16 row (oneDNN)
// and torch::mv reach about half and two thirds of the read bandwidth here, this
// kernel reaches it: each weight row is one sequential stream, accumulated in float32,
// and threads split the output rows. Large batches are bound by the multiply-adds
// instead: bfloat16 sums in the pair order of the AVX512-BF16 dot product, which every
// kernel follows (matvec.cpp), by that instruction or by float32 FMAs, whichever this CPU
// runs faster.
#pragma once
#include <vector>

#include "harness/model/tensor.h"

namespace kvevict {

// Whether matvec() takes weight [out, in], x ([in] or [B, in]) and bias (undefined
// or [out]) of this kind: on the CPU, all float32 or all bfloat16, contiguous weight and bias.
// Otherwise use torch::linear / torch::mv.
bool matvec_supported(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias = {});

// weight [out, in] times x [in] (+ bias [out]) -> [out] in x's dtype; x [B, in] gives
// [B, out] (a decode step's rows, with no reshaping op around the call). Each weight row
// is read once for all B rows. Every output is a float32 sum in a fixed order, rounded
// once to the dtype, the same for row b of a [B, in] x as for that row alone, so the
// result depends neither on the thread count nor on the batch. float32 and bfloat16 sum in
// different orders (bfloat16 in vdpbf16ps's pairs), each the same in every kernel of its dtype.
torch::Tensor matvec(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias = {});

// One weight [out, in] and its bias (undefined or [out]).
struct Linear {
  torch::Tensor weight, bias;
};

// matvec() of each weight with the same x ([in] or [B, in]; all weights of one dtype and
// width), in one parallel region whose threads share out the rows of all of them: a
// layer's q, k and v (or gate and up) cost one start and one wait of the threads, not
// three. Each output has matvec()'s bits.
std::vector<torch::Tensor> matvec_each(const std::vector<Linear>& linears, const torch::Tensor& x);

// The vector instructions matvec() runs: AVX-512 where the CPU has it, else AVX2 with FMA,
// else portable C++. bfloat16 on AVX-512 takes AVX512-BF16's dot product (vdpbf16ps) where
// the CPU has it and runs it faster than two float32 FMAs (bf16_dot_outruns_fma, measured
// once), else widens to float32 and multiplies with FMAs (exact products either way).
// float32: AVX-512 and AVX2 give the same bits (the AVX-512 kernel keeps the AVX2
// kernel's accumulators, two to a register); its portable loop sums in another order.
// bfloat16: every kernel gives the same bits, the portable loop too (except where vdpbf16ps
// flushes a denormal to zero). ATEN_CPU_CAPABILITY=avx2 (or default) keeps AVX-512 off,
// as it does for ATen. Avx512Bf16: the dot product runs.
enum class MatvecIsa { Portable, Avx2, Avx512, Avx512Bf16 };
MatvecIsa matvec_isa();

// Tests: no wider than `widest` from now on (Avx512Bf16 lifts the limit), so one machine
// checks that its kernels give the same bits.
void limit_matvec_isa(MatvecIsa widest);

// Tests: with `prefer`, bfloat16 takes vdpbf16ps wherever the CPU has it, even where two
// FMAs outrun it, so one machine checks both kernels; false returns to the measured choice.
void prefer_bf16_dot(bool prefer);

}  // namespace kvevict
