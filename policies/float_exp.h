// std::exp on floats, eight at a time, with std::exp's own bits. h2o-paper takes one
// exponential per key of every row (T^2/2 per head and layer); as calls to libm's expf
// they were 38% of its policy time in a T=1024 sim forward (perf).
//
// The vector loop is glibc's expf (x86-64, FMA build) operation for operation: x to
// double, k and r from one fused multiply-add each, 2^(k/32) from the same 32-entry
// table, the same cubic in fused multiply-adds, one rounding to float. Lanes outside its
// main range (|x| >= 2^7: overflow, underflow, inf, NaN) call expf itself. The loop is
// used only after it has matched expf on every float of a wide sample of its range in
// this process (another libm, or a CPU where glibc picks another expf, keeps the calls).
// tests/test_float_exp.cpp compares the two.
#pragma once
#include <cstdint>
#include <vector>

namespace kvevict {

// out[k] = std::exp(x[k] - shift) for k < n, the difference rounded to float first.
void exp_of_difference(const float* x, float shift, float* out, int n);

// Whether exp_of_difference runs the vector loop here (it checked itself against expf).
bool vector_expf_in_use();

// The vector loop alone, for the tests (only where the CPU has AVX2 and FMA).
bool vector_expf_supported();
void exp_of_difference_vector(const float* x, float shift, float* out, int n);

// Every stride-th float bit pattern of the loop's main range [-2^7, 2^7], both signs:
// what the self-check (stride 2048) and the tests compare against expf.
std::vector<float> expf_main_range_floats(uint32_t stride);

}  // namespace kvevict
