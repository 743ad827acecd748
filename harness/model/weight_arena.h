// CPU memory for a model's weights in 2 MiB pages. A decode step reads every weight once,
// and with 4 KiB pages that stream takes a TLB miss every 4 KiB: the float32 batch-1 step
// of the random 12 x 768 model on a 2-core Xeon ran at 46-47 tokens/s from a checkpoint
// whose page cache held 4 KiB pages, at 52 from one held in 2 MiB folios (llama.cpp's GGUF
// mapping had those: 54). A file's page cache is not ours to choose, so the weights are
// copied into one anonymous mapping marked MADV_HUGEPAGE, whatever the file's pages.
// The cost is at load: the kernel zeroes each new 2 MiB page (in this VM about 1.1 s of
// CPU for those 524 MB, most of the load).
#pragma once
#include "harness/model/tensor.h"

#include <cstddef>
#include <memory>

namespace kvevict {

class WeightArena {
 public:
  // Room for `bytes` of tensors (each rounded up to 64 bytes; weight_arena_bytes).
  explicit WeightArena(size_t bytes);

  // An uninitialised contiguous tensor in the arena; it keeps the arena's mapping alive.
  // Throws when the arena is full.
  torch::Tensor empty(at::IntArrayRef shape, torch::ScalarType dtype);

  // A tensor in the arena with source's shape and values, converted to `dtype` as
  // .to(dtype) converts.
  torch::Tensor copy_of(const torch::Tensor& source, torch::ScalarType dtype);

  // Whether `bytes` of weights fit in the memory the kernel reports available with 1 GiB
  // to spare; otherwise a model keeps its weights as views of the checkpoint's mapping,
  // which the kernel can page out.
  static bool fits_in_memory(size_t bytes);

 private:
  std::shared_ptr<uint8_t> base_;
  size_t size_ = 0, used_ = 0;
};

// What WeightArena needs for tensors of these element counts and dtype.
size_t weight_arena_bytes(int64_t numel, torch::ScalarType dtype);

}  // namespace kvevict
