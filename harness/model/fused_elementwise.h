// RMSNorm and rotate-half RoPE: the textbook ATen expressions, and each as one loop
// over the elements. A decode step runs them on one row, where every ATen op costs its
// dispatch and not its arithmetic (in a bfloat16 decode step of the 12 x 768 model their
// six to eight ops each were 7% of the time, for 768 numbers; the RMSNorm's ATen mean
// alone, 24 a step, was still 3% of it).
//
// The loops put each element through the same IEEE operations in the same order as
// ATen, rounded to the model's dtype where ATen rounds (bfloat16: after every op), with
// no fused multiply-add (the .cpp is built with -ffp-contract=off). RoPE and the residual
// sum have ATen's bits. The one reduction, RMSNorm's mean of squares, is the loops' own:
// summed in double in a fixed order, so a row's norm has the same bits on every CPU, alone
// or in a block (ATen's float sum, whose order depends on the CPU and on the row's
// strides, differs from it in the last bit of the mean now and then).
// tests/test_fused_elementwise.cpp compares the two.
#pragma once
#include <functional>
#include <utility>

#include "harness/model/tensor.h"

namespace kvevict {

// w * (x * rsqrt(mean(x^2, -1) + eps)): the square mean in float32 (float64 for a
// float64 x), the product with w in x's dtype. x [..., n], w [n].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

// {x + delta, rms_norm(x + delta, w, eps)} in one pass: a pre-norm layer's residual sum
// and the next block's input. x and delta [..., n] of one dtype.
std::pair<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                     const torch::Tensor& w, double eps);

// silu(gate) * up, SwiGLU's gate (Hugging Face's act_fn(gate_proj(x)) * up_proj(x)): the
// silu rounded to the dtype, then the product. Its exponentials are float_row_exp.h's
// (within 1.5 ulp of exp; ATen's Sleef is within 1), so on the CPU in float32 and
// bfloat16 each element's bits depend on its two values alone, on any CPU and thread
// count; other dtypes and devices take ATen's silu and product. gate and up [..., n].
torch::Tensor silu_times(const torch::Tensor& gate, const torch::Tensor& up);

// rotate-half RoPE of the first rotary_dim dims of every head: x [t, heads, head_dim],
// cos and sin [t, 1, rotary_dim] in x's dtype. Returns [t, heads, head_dim].
torch::Tensor rotate_half(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotary_dim);

// The two ways of computing them, which rms_norm() and rotate_half() choose between.
// Whether the loops take these operands: CPU, float32 or bfloat16, one dtype.
bool fused_elementwise_supported(const torch::Tensor& x, const torch::Tensor& partner);
torch::Tensor rms_norm_aten(const torch::Tensor& x, const torch::Tensor& w, double eps);
torch::Tensor rms_norm_fused(const torch::Tensor& x, const torch::Tensor& w, double eps);
torch::Tensor rotate_half_aten(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               int64_t rotary_dim);
torch::Tensor rotate_half_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                int64_t rotary_dim);

// op(x) for an element-wise ATen op whose vectorised and scalar loops round differently
// (silu, gelu, cos, sin: Sleef's functions against libm's). Above its grain ATen splits a
// tensor's elements over the threads at points that depend on the thread count, which
// moves elements between the two loops: silu of a [400, 172] block changed 1 to 3
// outputs between one thread and three. Here x's elements go in chunks of
// kElementwiseChunk, fixed by the size alone, each one serial ATen call, the chunks
// spread over the threads. Returns x's shape, contiguous. A float16 x (which LibTorch's
// CPU kernels lack) is computed in float32 and rounded once.
constexpr int64_t kElementwiseChunk = 16384;  // below ATen's grain (32768): one serial loop
torch::Tensor elementwise_in_chunks(const torch::Tensor& x, const std::function<torch::Tensor(const torch::Tensor&)>& op);

}  // namespace kvevict
