#include "harness/model/weight_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

constexpr size_t kTensorAlignment = 64;                  // a cache line: every vector load aligned
constexpr size_t kHugePageBytes = size_t{2} << 20;       // x86-64's PMD page

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// MemAvailable from /proc/meminfo in bytes; 0 where it cannot be read.
size_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib << 10;
  }
  return 0;
}

}  // namespace

size_t weight_arena_bytes(int64_t numel, torch::ScalarType dtype) {
  return round_up(static_cast<size_t>(numel) * c10::elementSize(dtype), kTensorAlignment);
}

bool WeightArena::fits_in_memory(size_t bytes) {
  const size_t available = available_memory_bytes();
  return available > (size_t{1} << 30) && bytes <= available - (size_t{1} << 30);
}

WeightArena::WeightArena(size_t bytes) : size_(round_up(std::max<size_t>(bytes, 1), kHugePageBytes)) {
  // One huge page more than needed, so that the arena can start on a 2 MiB boundary.
  const size_t mapped = size_ + kHugePageBytes;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot map " + std::to_string(mapped >> 20) + " MiB for the model's weights: " + std::strerror(errno));
  auto* raw = static_cast<uint8_t*>(p);
  auto* start = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(raw), kHugePageBytes));
  // Advice only: a kernel without transparent huge pages gives 4 KiB pages, and the
  // weights are the same.
  ::madvise(start, size_, MADV_HUGEPAGE);
  base_ = std::shared_ptr<uint8_t>(start, [raw, mapped](uint8_t*) { ::munmap(raw, mapped); });
}

torch::Tensor WeightArena::empty(at::IntArrayRef shape, torch::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(shape);
  const size_t bytes = weight_arena_bytes(numel, dtype);
  if (used_ + bytes > size_)
    throw Error("internal: the weight arena of " + std::to_string(size_) + " bytes is full");
  uint8_t* at = base_.get() + used_;
  used_ += bytes;
  std::shared_ptr<uint8_t> keep = base_;
  return torch::from_blob(at, shape, [keep](void*) {}, torch::TensorOptions().dtype(dtype));
}

torch::Tensor WeightArena::copy_of(const torch::Tensor& source, torch::ScalarType dtype) {
  return empty(source.sizes(), dtype).copy_(source);
}

}  // namespace kvevict
