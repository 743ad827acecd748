// What the tests that use LibTorch share: exact tensor comparison and a thread-count guard.
#pragma once
#include <ATen/Parallel.h>

#include "harness/model/tensor.h"
#include "harness/model/threads.h"

namespace kvevict::test {

// Same shape, dtype and bits in every element. A NaN on either side is never the same.
inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (a.is_floating_point() && (torch::isnan(a).any().item<bool>() || torch::isnan(b).any().item<bool>()))
    return false;
  if (!a.is_floating_point()) return torch::equal(a, b);
  const auto bits = a.element_size() == 8 ? torch::kInt64 : a.element_size() == 4 ? torch::kInt32 : torch::kInt16;
  return torch::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// Gives the intra-op thread count back at the end of a test that changes it.
struct ThreadCountGuard {
  int saved = at::get_num_threads();
  ~ThreadCountGuard() { set_thread_count(saved); }
};

}  // namespace kvevict::test
