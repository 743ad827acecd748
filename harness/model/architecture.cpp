#include "harness/model/architecture.h"

#include "harness/common/errors.h"

namespace kvevict {

int64_t config_int(const nlohmann::json& config, const std::string& path, const std::string& key) {
  if (!config.contains(key) || !config[key].is_number_integer())
    throw Error(path + ": missing integer key \"" + key + "\"");
  return config[key].get<int64_t>();
}

int64_t config_int_or(const nlohmann::json& config, const std::string& key, int64_t fallback) {
  return config.contains(key) && config[key].is_number_integer() ? config[key].get<int64_t>()
                                                                  : fallback;
}

double config_double_or(const nlohmann::json& config, const std::string& key, double fallback) {
  return config.contains(key) && config[key].is_number() ? config[key].get<double>() : fallback;
}

bool config_bool_or(const nlohmann::json& config, const std::string& key, bool fallback) {
  return config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
}

std::string checked_model_type(const nlohmann::json& config, const std::string& config_path) {
  if (!config.contains("model_type") || !config["model_type"].is_string())
    throw Error(config_path + ": missing string key \"model_type\"");
  const std::string type = config["model_type"].get<std::string>();
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3" &&
      type != "phi3" && type != "opt" && type != "gpt_neox")
    throw Error(config_path + ": unknown model_type \"" + type +
                "\" (supported: llama, mistral, qwen2, qwen3, phi3, opt, gpt_neox)");
  return type;
}

ArchSpec describe_architecture(const nlohmann::json& config, const std::string& config_path,
                               const HasTensor& has_tensor) {
  const std::string type = checked_model_type(config, config_path);
  if (type == "opt") return describe_opt(config, config_path, has_tensor);
  if (type == "gpt_neox") return describe_gpt_neox(config, config_path, has_tensor);
  return describe_llama(config, config_path, has_tensor);  // llama, mistral, qwen2, qwen3, phi3
}

}  // namespace kvevict
