#include "harness/model/rope.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "harness/common/errors.h"

namespace kvevict {
bool rope_depends_on_length(const ArchSpec& arch) { return arch.rope_scaling.type == "dynamic"; }

torch::Tensor rope_inv_freq(const ArchSpec& arch, int64_t seq_len, torch::ScalarType table) {
  const RopeScaling& r = arch.rope_scaling;
  const int64_t dim = arch.rotary_dim;
  double base = arch.rope_theta;
  if (r.type == "dynamic" && seq_len > arch.max_positions) {
    // NTK-aware: the base grows with the sequence once it passes the trained context.
    const double ratio = r.factor * static_cast<double>(seq_len) / arch.max_positions - (r.factor - 1);
    base *= std::pow(ratio, static_cast<double>(dim) / (dim - 2));
  }
  auto idx = torch::arange(0, dim, 2, torch::kLong).to(table);
  auto inv_freq = 1.0 / torch::pow(torch::tensor(base, table), idx / static_cast<double>(dim));
  if (r.type == "linear") return inv_freq / r.factor;
  if (r.type == "llama3") {
    // Long wavelengths are slowed by `factor`, short ones kept, and the band in between
    // blended linearly in original_context / wavelength.
    const double original = static_cast<double>(r.original_max_positions);
    const double low_wavelen = original / r.low_freq_factor, high_wavelen = original / r.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
    auto smooth = (original / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    auto blended = (1 - smooth) * scaled / r.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    return torch::where(medium, blended, scaled);
  }
  return inv_freq;
}

namespace {

// The angles' cos and sin in T (inv_freq's dtype): [t, 2 * half] each, whose two halves
// are the same (Hugging Face's cat(freqs, freqs)): each value computed once, stored twice.
template <typename T>
void cos_sin_rows(const T* inv_freq, int64_t half, int64_t start, int64_t t, T* cos, T* sin) {
  const int64_t width = 2 * half;
  at::parallel_for(0, t, std::max<int64_t>(1, 2048 / width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T position = static_cast<T>(start + row);
      T* row_cos = cos + row * width;
      T* row_sin = sin + row * width;
      for (int64_t j = 0; j < half; ++j) {
        const double angle = static_cast<double>(position * inv_freq[j]);
        row_cos[j] = row_cos[half + j] = static_cast<T>(std::cos(angle));
        row_sin[j] = row_sin[half + j] = static_cast<T>(std::sin(angle));
      }
    }
  });
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& inv_freq, int64_t start, int64_t t,
                                                     torch::ScalarType dtype, torch::Device device) {
  const bool in_double = inv_freq.scalar_type() == torch::kFloat64;
  const auto table = inv_freq.to(torch::kCPU, in_double ? torch::kFloat64 : torch::kFloat32).contiguous();
  const int64_t half = table.numel();
  auto cos = torch::empty({t, 1, 2 * half}, table.options());
  auto sin = torch::empty({t, 1, 2 * half}, table.options());
  if (in_double)
    cos_sin_rows(table.data_ptr<double>(), half, start, t, cos.data_ptr<double>(), sin.data_ptr<double>());
  else
    cos_sin_rows(table.data_ptr<float>(), half, start, t, cos.data_ptr<float>(), sin.data_ptr<float>());
  return {cos.to(device, dtype), sin.to(device, dtype)};
}

}  // namespace kvevict
