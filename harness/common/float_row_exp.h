// The exponentials of a float logits row's differences from its maximum, in float: the
// policy driver's softmax over a query's slots (slot_softmax.h) takes one per seen slot
// of every query row, 4.8 billion in an 8192-token prefill of the 12-layer bench model.
// In double (double_exp.h) they were the largest cost of a policy's prefill after the
// products, twice the full cache's float softmax (perf); a float row's shares are floats.
//
// exp(d) = 2^k * p(r), k = round(d / ln 2), r = d - k ln 2 in two parts (|r| <= ln 2 / 2),
// p = 1 + (e^r - 1 by its Taylor polynomial to degree 7), 2^k added to p's exponent: no
// table, within 1.5 ulp of exp (1.2 measured). The same operations, in fused
// multiply-adds, in the 16-lane loop (AVX-512), the 8-lane one (AVX2 with FMA) and the
// scalar code (std::fma), so the bits do not depend on the CPU. d < -87 gives 0 (exp(-87)
// is 2^-125.5: a share that small rounds to nothing beside the maximum's 1); NaN stays
// NaN. For d <= 0 only, as a softmax's differences are: a positive d is not checked.
// tests/test_float_row_exp.cpp checks the loops against the scalar code and std::exp.
#pragma once

namespace kvevict {

// Lanes of a row's sum of exponentials (slot_softmax.h): slot s adds to lane s % 8.
constexpr int kRowSumLanes = 8;

// out[k] = exp(x[k] - shift) for k < n, the difference rounded to float first, and
// double(out[k]) added to lanes[k % kRowSumLanes], in k order within a lane. out may be x.
void exp_row_differences(const float* x, float shift, float* out, int n, double (&lanes)[kRowSumLanes]);

// out[k] = exp(d[k]) for k < n, as above; out may be d.
void exp_floats(const float* d, float* out, int n);
// The scalar code alone, for the tests: the vector loops must give its bits.
void exp_floats_scalar(const float* d, float* out, int n);

}  // namespace kvevict
