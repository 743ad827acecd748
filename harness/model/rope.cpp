#include "harness/model/rope.h"

#include <algorithm>
#include <cmath>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

double required_number(const nlohmann::json& scaling, const std::string& path,
                       const std::string& type, const char* key) {
  if (!scaling.contains(key) || !scaling[key].is_number())
    throw Error(path + ": rope_scaling type \"" + type + "\" needs a number \"rope_scaling." +
                key + "\"");
  return scaling[key].get<double>();
}

}  // namespace

RopeScaling read_rope_scaling(const nlohmann::json& c, const std::string& path,
                              const std::vector<std::string>& allowed) {
  RopeScaling rope;
  const char* key = c.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!c.contains(key) || c[key].is_null()) return rope;
  const nlohmann::json& s = c[key];
  if (!s.is_object()) throw Error(path + ": \"" + key + "\" must be an object or null");
  // "type" is the older spelling of "rope_type".
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
  if (!s.contains(type_key) || !s[type_key].is_string())
    throw Error(path + ": \"" + key + "\" has no string \"rope_type\"");
  rope.type = s[type_key].get<std::string>();
  if (std::find(allowed.begin(), allowed.end(), rope.type) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw Error(path + ": " + key + "." + type_key + " \"" + rope.type +
                "\" is not implemented for model_type " + c.value("model_type", std::string("?")) +
                " (supported: " + list + ")");
  }
  if (rope.type == "default") return rope;
  rope.factor = required_number(s, path, rope.type, "factor");
  if (rope.type == "llama3") {
    rope.low_freq_factor = required_number(s, path, rope.type, "low_freq_factor");
    rope.high_freq_factor = required_number(s, path, rope.type, "high_freq_factor");
    rope.original_max_positions =
        static_cast<int64_t>(required_number(s, path, rope.type, "original_max_position_embeddings"));
    if (rope.high_freq_factor <= rope.low_freq_factor)
      throw Error(path + ": rope_scaling.high_freq_factor must exceed rope_scaling.low_freq_factor");
  }
  return rope;
}

bool rope_depends_on_length(const ArchSpec& arch) { return arch.rope_scaling.type == "dynamic"; }

torch::Tensor rope_inv_freq(const ArchSpec& arch, int64_t seq_len) {
  const RopeScaling& r = arch.rope_scaling;
  const int64_t dim = arch.rotary_dim;
  double base = arch.rope_theta;
  if (r.type == "dynamic" && seq_len > arch.max_positions) {
    // NTK-aware: the base grows with the sequence once it passes the trained context.
    const double ratio = r.factor * static_cast<double>(seq_len) / arch.max_positions - (r.factor - 1);
    base *= std::pow(ratio, static_cast<double>(dim) / (dim - 2));
  }
  auto idx = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat32);
  auto inv_freq = 1.0 / torch::pow(torch::tensor(base, torch::kFloat32), idx / static_cast<float>(dim));
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
