// std::exp on doubles, four or eight at a time, with std::exp's own bits. Sim mode's masked
// softmax of every realisable policy takes one double exponential per kept slot of every
// row (about 30 million per T=1024 forward of the 12-layer bench model); as calls to
// libm's exp they were its largest cost after the products (perf).
//
// The vector loop is glibc's exp (x86-64, FMA build) operation for operation: k and r
// from fused multiply-adds, 2^(k/128) as a double and its relative tail from a 128-entry
// table, the same quintic in fused multiply-adds, scale + scale * tmp. The table is
// computed here, exactly (GMP's integer roots), by glibc's definition: the double
// nearest 2^(k/128), and the double nearest its relative error. Lanes outside exp's main
// path (|x| < 2^-54, |x| >= 512, inf, NaN) call std::exp. The loop is used only after
// it has matched std::exp on a wide sample of its range in this process (another libm,
// or a CPU where glibc picks its non-FMA exp, keeps the calls). Where the CPU has AVX-512
// (and ATEN_CPU_CAPABILITY is not avx2 or default) the loop takes eight lanes at a time,
// with the same operations.
// tests/test_double_exp.cpp compares the two.
#pragma once
#include <cstdint>
#include <vector>

namespace kvevict {

// out[k] = std::exp(x[k]) for k < n; out may be x.
void exp_doubles(const double* x, double* out, int n);

// out[k] = std::exp(double(x[k]) - shift) for k < n, and each out[k] added to
// lanes[k % kExpSumLanes], in k order within a lane: slot_softmax's pass over a row whose
// slots are all seen and in column order (slot_softmax.h keeps its sum in these lanes).
constexpr int kExpSumLanes = 8;
void exp_differences(const float* x, double shift, double* out, int n, double (&lanes)[kExpSumLanes]);

// Whether exp_doubles runs the vector loop here (it checked itself against std::exp).
bool vector_exp_in_use();

// The vector loop alone (eight lanes or four, as exp_doubles runs it), for the tests;
// only where the CPU has AVX2 and FMA.
bool vector_exp_supported();
void exp_doubles_vector(const double* x, double* out, int n);

// Doubles spread over exp's main path, both signs: every stride-th bit pattern of each
// binade from 2^-54 up to 512, offset within the binade by `offset`. What the self-check
// and the tests compare against std::exp.
std::vector<double> exp_main_path_doubles(uint64_t stride, uint64_t offset);

}  // namespace kvevict
