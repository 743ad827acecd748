// The machine's limits, measured in the running process, for `kvevict bench`: GEMM
// throughput on a model's own weight shapes, memory-read bandwidth, and peak RSS. A
// phase is then reported as a fraction of its limit.
#pragma once
#include "harness/model/tensor.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/model/architecture.h"

namespace kvevict {

// The best of `repeat` runs of fn (at least one), in seconds.
template <typename Fn>
double best_seconds(int repeat, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < std::max(1, repeat); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct GemmPeak {
  double mix_flops_per_s = 0;  // all the model's linear layers of one forward, as it runs them
  double best_flops_per_s = 0;  // the fastest single weight shape
  std::string best_shape;       // "[rows x out x in]"
};

// Times x [rows, in] @ W[out, in]^T for every distinct weight shape of `arch` (random
// values, `dtype`), best of `repeat`.
GemmPeak measure_gemm_peak(const ArchSpec& arch, torch::ScalarType dtype, int64_t rows, int repeat);

// One pass over every weight matrix of `arch` (random values in `dtype`, the model's own
// shapes, each its own buffer, in 2 MiB pages as Model::load places them; the LM head
// included), through the kernel a decode step uses for them, for `batch` rows at once: a
// decode step's weight stream and its products alone, without the per-op work around
// it. The weights are made once;
// seconds(repeat, batch) times the pass, best of `repeat`.
class WeightPass {
 public:
  WeightPass(const ArchSpec& arch, torch::ScalarType dtype);
  double seconds(int repeat, int64_t batch = 1) const;

 private:
  std::vector<torch::Tensor> weights_;
  torch::ScalarType dtype_;
};

struct ReadBandwidth {
  double bytes_per_s = 0;
  int threads = 0;  // how many threads read a slice (the ATen thread count, unless the pool fails)
};

// Bytes per second of reading a buffer of `bytes` (far larger than the caches): each of
// the current ATen threads streams its own slice with several accumulators at once;
// the best of `repeat` (at least 3) runs. The buffer is made (and every page touched)
// once, so a phase can be bracketed by measurements taken just before it. It sits in
// 2 MiB pages, as a model's weights do (weight_arena.h).
class BandwidthProbe {
 public:
  explicit BandwidthProbe(int64_t bytes);
  ReadBandwidth measure(int repeat) const;

 private:
  torch::Tensor buffer_;  // [bytes / 8] int64, all ones
};
ReadBandwidth measure_read_bandwidth(int64_t bytes, int repeat);

struct FmaPeak {
  double f32_flops_per_s = 0;  // float32 multiply-adds (2 FLOPs each), the best instruction set
  std::string f32_isa;         // which: "avx512", "avx2" or "portable"
  double bf16_dot_flops_per_s = 0;  // AVX512-BF16 dot products (vdpbf16ps); 0 where the CPU lacks them
  int threads = 0;                  // how many ATen threads ran the chains
};

// The arithmetic peak: each of the current ATen threads runs independent chains of
// register-only multiply-adds (enough to cover the FMA latency on every port), so no
// memory is touched; the best of `repeat` (at least 3) runs. The limit of a prefill and
// of a large batch's decode step. float32 with AVX-512 and AVX2 (whichever is faster:
// some CPUs have one 512-bit FMA port, others two), and the bfloat16 dot product that
// llama.cpp's BF16 kernels use where the CPU has it.
FmaPeak measure_fma_peak(int repeat);

// FLOPs of one forward over t tokens: the linear layers (2 per multiply-add) plus causal
// attention (scores and weighted values over the t(t+1)/2 visible pairs per head).
double forward_flops(const ArchSpec& arch, int64_t t);
// Of which, per token: the linear layers' FLOPs; and per (query, visible key) pair the
// attention's (scores and values, every head and layer).
double linear_flops_per_token(const ArchSpec& arch);
double attention_flops_per_pair(const ArchSpec& arch);

// Bytes of the weight matrices a one-token decode step reads (every layer's matrices,
// the LM head and the vector weights; one embedding row), in `dtype`.
double decode_weight_bytes(const ArchSpec& arch, torch::ScalarType dtype);

// KV bytes one token occupies in every layer's cache together, in `dtype`.
double kv_bytes_per_token(const ArchSpec& arch, torch::ScalarType dtype);

// Peak resident set size of this process since the last reset_peak_rss(), in bytes
// (Linux VmHWM; 0 where unavailable).
int64_t peak_rss_bytes();
void reset_peak_rss();
// "1.23 0.98 0.75" from /proc/loadavg, so every number is printed with the load it ran under.
std::string load_average();

}  // namespace kvevict
