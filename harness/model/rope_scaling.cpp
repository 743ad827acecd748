// config.json's rope_scaling, read without LibTorch (declared in architecture.h) so the
// config readers build and fuzz on their own; the frequencies are in rope.cpp.
#include <algorithm>
#include <cmath>

#include "harness/model/architecture.h"
#include "harness/common/errors.h"

namespace kvevict {

namespace {

double required_number(const nlohmann::json& scaling, const std::string& path,
                       const std::string& type, const char* key) {
  if (!scaling.contains(key) || !scaling[key].is_number())
    throw Error(path + ": rope_scaling type \"" + type + "\" needs a number \"rope_scaling." +
                key + "\"");
  const double value = scaling[key].get<double>();
  if (!std::isfinite(value) || value <= 0)
    throw Error(path + ": rope_scaling." + key + " must be a positive finite number");
  return value;
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
    const double original = required_number(s, path, rope.type, "original_max_position_embeddings");
    if (original > static_cast<double>(kMaxPositions))
      throw Error(path + ": rope_scaling.original_max_position_embeddings is above " + std::to_string(kMaxPositions));
    rope.original_max_positions = static_cast<int64_t>(original);
    if (rope.high_freq_factor <= rope.low_freq_factor)
      throw Error(path + ": rope_scaling.high_freq_factor must exceed rope_scaling.low_freq_factor");
  }
  return rope;
}

}  // namespace kvevict
