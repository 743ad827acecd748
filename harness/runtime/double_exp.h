// The exponential of the policy softmax (slot_softmax.h) over a float64 row (a reference
// run's), on doubles, eight or four at a time; a float row's are floats (float_row_exp.h).
//
// exp(x) = 2^(k/16) * exp(r), with k = round(16 x / ln 2) and |r| <= ln 2 / 32: 2^(j/16)
// as a double and its relative tail from a 16-entry table (computed exactly, with GMP's
// integer roots), exp(r) - 1 from r's Taylor polynomial to degree 7, summed with the tail
// and scaled in fused multiply-adds. Within one ulp of the true exponential (most values
// are std::exp's own), with the same bits on every CPU: the eight-lane loop (AVX-512, its
// table in two registers), the four-lane loop (AVX2 with FMA, the table gathered) and the
// scalar code (std::fma) run the same operations. Off the path (|x| >= 708, NaN) every
// lane calls std::exp. Chosen over glibc's exp, whose 128-entry table the loops had to
// gather (perf: 0.88 against 0.66 ns an exponential).
// tests/test_double_exp.cpp checks the three against each other and against std::exp.
#pragma once
#include <cstdint>
#include <vector>

#include "harness/common/cpu_isa.h"

namespace kvevict {

// out[k] = exp(x[k]) for k < n, as above; out may be x.
void exp_doubles(const double* x, double* out, int n);

// The scalar code alone, for the tests: the vector loops must give its bits.
void exp_doubles_scalar(const double* x, double* out, int n);

// Doubles spread over exp's range, both signs: every stride-th bit pattern of each binade
// from 2^-54 up to 512, offset within the binade by `offset`.
std::vector<double> exp_main_path_doubles(uint64_t stride, uint64_t offset);

}  // namespace kvevict
