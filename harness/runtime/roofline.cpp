#include "harness/runtime/roofline.h"

#include "harness/common/multiply_add_chains.h"
#include "harness/model/matvec.h"
#include "harness/model/weight_arena.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace kvevict {
namespace {

bool is_matrix_role(Role role) { return role != Role::Embed && role != Role::PositionEmbed; }

// (out, in) -> how many times one forward multiplies by a weight of that shape.
std::map<std::pair<int64_t, int64_t>, int> linear_shapes(const ArchSpec& arch) {
  std::map<std::pair<int64_t, int64_t>, int> shapes;
  for (const TensorSpec& spec : arch.tensors)
    if (spec.shape.size() == 2 && is_matrix_role(spec.role)) ++shapes[{spec.shape[0], spec.shape[1]}];
  if (arch.tied_head)  // the head is the embedding matrix, multiplied by every row
    for (const TensorSpec& spec : arch.tensors)
      if (spec.role == Role::Embed) ++shapes[{spec.shape[0], spec.shape[1]}];
  return shapes;
}

}  // namespace

GemmPeak measure_gemm_peak(const ArchSpec& arch, torch::ScalarType dtype, int64_t rows, int repeat) {
  torch::NoGradGuard no_grad;
  GemmPeak peak;
  double mix_flops = 0, mix_seconds = 0;
  for (const auto& [shape, count] : linear_shapes(arch)) {
    const auto [out, in] = shape;
    auto x = torch::randn({rows, in}).to(dtype);
    auto w = (torch::randn({out, in}) * 0.02).to(dtype);
    torch::linear(x, w);  // warm-up: first-touch pages and library set-up
    const double s = best_seconds(repeat, [&] { torch::linear(x, w); });
    const double flops = 2.0 * rows * out * in;
    mix_flops += count * flops;
    mix_seconds += count * s;
    if (flops / s > peak.best_flops_per_s) {
      peak.best_flops_per_s = flops / s;
      peak.best_shape = "[" + std::to_string(rows) + " x " + std::to_string(out) + " x " + std::to_string(in) + "]";
    }
  }
  peak.mix_flops_per_s = mix_seconds > 0 ? mix_flops / mix_seconds : 0;
  return peak;
}

WeightPass::WeightPass(const ArchSpec& arch, torch::ScalarType dtype) : dtype_(dtype) {
  torch::NoGradGuard no_grad;
  size_t bytes = 0;
  for (const auto& [shape, count] : linear_shapes(arch)) bytes += count * weight_arena_bytes(shape.first * shape.second, dtype);
  WeightArena arena(bytes);  // the model's pages (Model::load)
  for (const auto& [shape, count] : linear_shapes(arch))
    for (int c = 0; c < count; ++c)
      weights_.push_back(arena.copy_of(torch::randn({shape.first, shape.second}) * 0.02, dtype));
  seconds(1);  // warm-up: first-touch pages
}

double WeightPass::seconds(int repeat, int64_t batch) const {
  torch::NoGradGuard no_grad;
  std::map<int64_t, torch::Tensor> inputs;  // by width: [batch, width]
  for (const auto& w : weights_)
    if (!inputs.count(w.size(1))) inputs[w.size(1)] = torch::randn({batch, w.size(1)}).to(dtype_);
  return best_seconds(repeat, [&] {
    for (const auto& w : weights_) {
      const auto& x = inputs.at(w.size(1));
      if (matvec_supported(w, x))
        matvec(w, x);
      else
        torch::mm(x, w.t());
    }
  });
}

namespace {

// Sums words [begin, end) with eight independent accumulators, so a thread keeps many
// cache-line loads in flight (one accumulator would make it latency-bound).
uint64_t sum_words_portable(const uint64_t* data, int64_t begin, int64_t end) {
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += data[i + k];
  for (; i < end; ++i) acc[0] += data[i];
  uint64_t sum = 0;
  for (uint64_t a : acc) sum += a;
  return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same with 256-bit loads, as the decode kernels read (harness/model/matvec.cpp).
__attribute__((target("avx2"))) uint64_t sum_words_avx2(const uint64_t* data, int64_t begin, int64_t end) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = begin;
  auto at = [data](int64_t j) { return reinterpret_cast<const __m256i*>(data + j); };
  for (; i + 16 <= end; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(at(i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(at(i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(at(i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(at(i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + sum_words_portable(data, i, end);
}
#endif

uint64_t sum_words(const uint64_t* data, int64_t begin, int64_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return sum_words_avx2(data, begin, end);
#endif
  return sum_words_portable(data, begin, end);
}

}  // namespace

BandwidthProbe::BandwidthProbe(int64_t bytes) {
  const int64_t words = std::max<int64_t>(bytes / 8, 1);
  buffer_ = WeightArena(weight_arena_bytes(words, torch::kLong)).empty({words}, torch::kLong);
  buffer_.fill_(1);  // written: every page is real
}

ReadBandwidth BandwidthProbe::measure(int repeat) const {
  const int64_t words = buffer_.numel();
  const auto* data = reinterpret_cast<const uint64_t*>(buffer_.data_ptr<int64_t>());
  const int threads = at::get_num_threads();
  const int runs = std::max(repeat, 3);
  ReadBandwidth result;
  uint64_t sink = 0;
  std::vector<uint64_t> partial(static_cast<size_t>(threads));
  std::vector<char> took_part(static_cast<size_t>(threads));
  const double best = best_seconds(runs, [&] {
    std::fill(partial.begin(), partial.end(), 0);
    std::fill(took_part.begin(), took_part.end(), 0);
    // One contiguous slice per thread: each thread streams its own part of the buffer.
    at::parallel_for(0, words, (words + threads - 1) / threads, [&](int64_t begin, int64_t end) {
      const auto thread = static_cast<size_t>(at::get_thread_num());
      partial[thread] += sum_words(data, begin, end);
      took_part[thread] = 1;
    });
    for (uint64_t p : partial) sink += p;
    result.threads = std::max(result.threads, static_cast<int>(std::count(took_part.begin(), took_part.end(), 1)));
  });
  if (sink != static_cast<uint64_t>(words) * static_cast<uint64_t>(runs))
    throw std::logic_error("BandwidthProbe: the sum over the buffer is wrong");  // keeps the sums alive
  result.bytes_per_s = static_cast<double>(words * 8) / best;
  return result;
}

ReadBandwidth measure_read_bandwidth(int64_t bytes, int repeat) { return BandwidthProbe(bytes).measure(repeat); }

namespace {

constexpr int64_t kFmaIterations = 4'000'000;

// FLOPs per second of `chains(n)` run on every ATen thread at once, each its own chains;
// `flops_per_iteration` counts one iteration of all the chains. The best of `repeat`.
double chains_flops_per_s(float (*chains)(int64_t), double flops_per_iteration, int repeat, int* threads_used) {
  const int threads = at::get_num_threads();
  std::vector<float> results(static_cast<size_t>(threads));
  std::vector<char> took_part(static_cast<size_t>(threads));
  chains(kFmaIterations / 16);  // warm-up: the core leaves its low-power state for wide vectors
  const double best = best_seconds(std::max(repeat, 3), [&] {
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) results[static_cast<size_t>(t)] = chains(kFmaIterations);
      took_part[static_cast<size_t>(at::get_thread_num())] = 1;
    });
  });
  float sink = 0;
  for (float r : results) sink += r;
  if (!(sink > 0)) throw std::logic_error("measure_fma_peak: the chains' sums are wrong");  // keeps them alive
  *threads_used = static_cast<int>(std::count(took_part.begin(), took_part.end(), 1));
  return threads * static_cast<double>(kFmaIterations) * flops_per_iteration / best;
}

}  // namespace

FmaPeak measure_fma_peak(int repeat) {
  FmaPeak peak;
  peak.f32_flops_per_s = chains_flops_per_s(fma_chains_portable, 2.0 * kMultiplyAddChains, repeat, &peak.threads);
  peak.f32_isa = "portable";
#if defined(__x86_64__) && defined(__GNUC__)
  auto try_isa = [&](float (*chains)(int64_t), int lanes, const char* isa) {
    const double flops = chains_flops_per_s(chains, 2.0 * kMultiplyAddChains * lanes, repeat, &peak.threads);
    if (flops > peak.f32_flops_per_s) {
      peak.f32_flops_per_s = flops;
      peak.f32_isa = isa;
    }
  };
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) try_isa(fma_chains_avx2, 8, "avx2");
  if (__builtin_cpu_supports("avx512f")) try_isa(fma_chains_avx512, 16, "avx512");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
    peak.bf16_dot_flops_per_s = chains_flops_per_s(bf16_dot_chains, 4.0 * kMultiplyAddChains * 16, repeat, &peak.threads);
#endif
  return peak;
}

double linear_flops_per_token(const ArchSpec& arch) {
  double per_token = 0;
  for (const auto& [shape, count] : linear_shapes(arch)) per_token += 2.0 * count * shape.first * shape.second;
  return per_token;
}

double attention_flops_per_pair(const ArchSpec& arch) {
  return 2.0 * 2.0 * arch.n_heads * arch.head_dim * arch.n_layers;  // q.k and p.v, 2 FLOPs a multiply-add
}

double forward_flops(const ArchSpec& arch, int64_t t) {
  const double pairs = static_cast<double>(t) * (t + 1) / 2;
  return linear_flops_per_token(arch) * t + attention_flops_per_pair(arch) * pairs;
}

double decode_weight_bytes(const ArchSpec& arch, torch::ScalarType dtype) {
  const double element = static_cast<double>(c10::elementSize(dtype));
  double elements = 0;
  for (const TensorSpec& spec : arch.tensors) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    if (spec.role == Role::Embed || spec.role == Role::PositionEmbed)
      n = spec.shape.size() == 2 ? static_cast<double>(spec.shape[1]) : n;  // one row
    elements += n;
  }
  if (arch.tied_head)
    for (const TensorSpec& spec : arch.tensors)
      if (spec.role == Role::Embed) elements += static_cast<double>(spec.shape[0]) * spec.shape[1];
  return elements * element;
}

double kv_bytes_per_token(const ArchSpec& arch, torch::ScalarType dtype) {
  return 2.0 * arch.n_layers * arch.n_kv_heads * arch.head_dim * static_cast<double>(c10::elementSize(dtype));
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  return 0;
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";  // resets VmHWM to the current RSS
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

}  // namespace kvevict
