// The causal (and sliding-window) softmax of attention logits, with ATen's bits, that
// skips the keys a query cannot see. ATen's softmax runs over every key of every row:
// in a block whose keys end at its last query, half the exponentials are of -inf. On
// stories260K's short RTE requests that softmax was 39% of the forward (perf), and
// Sleef's exp alone 16% of the run.
//
// Bits: ATen's float32 softmax over a row is a lane-wise maximum, exp(x - max) per
// element (Sleef), a lane-wise sum, and x * (1 / sum); each lane sums elements i, i+8, ...
// in order, then the lanes combine in a fixed tree (AVX2). A masked key adds -inf to a
// maximum and +0 to a sum, which change no lane, so the row can stop at the first
// 8-element chunk past the query and its other entries are +0. The loop is ATen's own
// AVX2 sequence, taken only where ATen itself runs its AVX2 kernels (it asks ATen's
// dispatcher: ATEN_CPU_CAPABILITY or another CPU picks others) and where every visible
// logit gives a finite maximum; otherwise ATen's softmax runs.
// tests/test_causal_softmax.cpp compares the two bit for bit (a NaN matches any NaN:
// which one a product of two NaNs gives depends on the compiler's operand order).
#pragma once
#include <cstdint>

#include "harness/model/tensor.h"

namespace kvevict {

// The masking both paths apply: logits [R, n], row r a query at position
// first_query + r % rows; keys j > that position, and those at or before position -
// window when window > 0, are hidden.
struct CausalRows {
  int64_t first_query = 0;
  int64_t rows = 1;
  int64_t window = 0;
};

// The probabilities of logits [..., n] (any dtype and device): the loop below where it
// gives ATen's bits, else causal_softmax_aten. Either way the logits are overwritten.
torch::Tensor causal_softmax(torch::Tensor logits, const CausalRows& mask);

// The two ways. The softmax of a contiguous float32 CPU block [..., n], in place, with the hidden keys
// at probability +0. Returns false, leaving the block as it was, when it cannot give
// ATen's bits (ATen not on its AVX2 kernels, another dtype or layout).
bool causal_softmax_in_place(torch::Tensor& logits, const CausalRows& mask);

// The same through ATen: the hidden keys set to -inf, then torch::softmax (any dtype).
torch::Tensor causal_softmax_aten(torch::Tensor logits, const CausalRows& mask);

// Whether ATen dispatches its CPU kernels to their AVX2 builds in this process.
bool aten_uses_avx2_kernels();

}  // namespace kvevict
