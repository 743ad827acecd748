#include "harness/model/rope.h"

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

}  // namespace kvevict
