#include "harness/model/architecture.h"

#include <cmath>
#include <limits>

#include "harness/common/errors.h"
#include "harness/common/text.h"

namespace kvevict {

namespace {

// A key that is absent or null takes the default; any other value must have the right type.
bool present(const nlohmann::json& config, const std::string& key) {
  return config.is_object() && config.contains(key) && !config[key].is_null();
}

}  // namespace

int64_t config_int(const nlohmann::json& config, const std::string& path, const std::string& key) {
  if (!present(config, key) || !config[key].is_number_integer())
    throw Error(path + ": missing integer key \"" + key + "\"");
  return config[key].get<int64_t>();
}

int64_t config_int(const nlohmann::json& config, const std::string& path, const std::string& key,
                   int64_t min, int64_t max) {
  const int64_t value = config_int(config, path, key);
  if (value < min || value > max || (config[key].is_number_unsigned() && value < 0))
    throw Error(path + ": key \"" + key + "\" is " + config[key].dump() + ", outside [" +
                std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

int64_t config_int_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                      int64_t fallback, int64_t min, int64_t max) {
  if (!present(config, key)) return fallback;
  if (!config[key].is_number_integer())
    throw Error(path + ": key \"" + key + "\" must be an integer, not " + config[key].dump());
  return config_int(config, path, key, min, max);
}

double config_double_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                        double fallback, double min, double max) {
  if (!present(config, key)) return fallback;
  if (!config[key].is_number())
    throw Error(path + ": key \"" + key + "\" must be a number, not " + config[key].dump());
  const double value = config[key].get<double>();
  if (!std::isfinite(value) || value < min || value > max)
    throw Error(path + ": key \"" + key + "\" is " + config[key].dump() + ", outside [" +
                short_number(min) + ", " + short_number(max) + "]");
  return value;
}

bool config_bool_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                    bool fallback) {
  if (!present(config, key)) return fallback;
  if (!config[key].is_boolean())
    throw Error(path + ": key \"" + key + "\" must be true or false, not " + config[key].dump());
  return config[key].get<bool>();
}

std::string config_string_or(const nlohmann::json& config, const std::string& path,
                             const std::string& key, const std::string& fallback) {
  if (!present(config, key)) return fallback;
  if (!config[key].is_string())
    throw Error(path + ": key \"" + key + "\" must be a string, not " + config[key].dump());
  return config[key].get<std::string>();
}

int config_token_id_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                       int fallback, int64_t vocab) {
  // Llama-3.1 lists several end-of-sequence ids; the first one is the text's own.
  if (present(config, key) && config[key].is_array()) {
    if (config[key].empty() || !config[key][0].is_number_integer())
      throw Error(path + ": key \"" + key + "\" must be a token id or a list of token ids");
    nlohmann::json first = {{key, config[key][0]}};
    return static_cast<int>(config_int(first, path, key, 0, vocab - 1));
  }
  return static_cast<int>(config_int_or(config, path, key, fallback, 0, vocab - 1));
}

void read_mha_shape(ArchSpec& a, const nlohmann::json& config, const std::string& path) {
  a.hidden = config_int(config, path, "hidden_size", 1, kMaxHidden);
  a.n_layers = config_int(config, path, "num_hidden_layers", 1, kMaxLayers);
  a.n_heads = config_int(config, path, "num_attention_heads", 1, kMaxHeads);
  if (a.hidden % a.n_heads != 0)
    throw Error(path + ": hidden_size " + std::to_string(a.hidden) +
                " is not divisible by num_attention_heads " + std::to_string(a.n_heads));
  a.n_kv_heads = a.n_heads;
  a.head_dim = a.hidden / a.n_heads;
}

DmcSpec read_dmc(const ArchSpec& a, const nlohmann::json& config, const std::string& path,
                 const std::string& refusal) {
  const char* kWindow = "dmc_window_size";
  const char* kInit = "dmc_init_val";
  const bool has_window = present(config, kWindow), has_init = present(config, kInit);
  if (!has_window && !has_init) return {};
  const std::string key = has_window ? kWindow : kInit;
  if (!refusal.empty())
    throw Error(path + ": key \"" + key + "\" (DMC) is not implemented for model_type " + a.model_type + " (" +
                refusal + ")");
  if (!has_window || !has_init)
    throw Error(path + ": key \"" + key + "\" (DMC) needs \"" + (has_window ? kInit : kWindow) + "\" too");
  DmcSpec dmc;
  dmc.window = config_int(config, path, kWindow, 1, kMaxPositions);
  // Any finite c is well defined (dmc.cpp: k - c > 0 merges, sigmoid(q + c) weighs): a huge
  // one means "never merge" (+) or "always merge" (-), so only a non-finite value is refused.
  const double largest = std::numeric_limits<double>::max();
  dmc.init_val = config_double_or(config, path, kInit, 0, -largest, largest);
  // The decision and the importance live in the last dimension of each head.
  if (a.head_dim < 2)
    throw Error(path + ": key \"" + std::string(kWindow) + "\" (DMC) needs head_dim of at least 2, not " +
                std::to_string(a.head_dim));
  return dmc;
}

int64_t read_rotary_dim(const ArchSpec& a, const nlohmann::json& config, const std::string& path,
                        const std::string& fraction_key, double fallback) {
  const double fraction = config_double_or(config, path, fraction_key, fallback, 0, 1);
  const int64_t rotary_dim = static_cast<int64_t>(a.head_dim * fraction);
  if (rotary_dim > 0 && rotary_dim % 2 == 0) return rotary_dim;
  const std::string head_dim =
      present(config, "head_dim")
          ? "head_dim " + std::to_string(a.head_dim)
          : "head_dim " + std::to_string(a.head_dim) + " (hidden_size " + std::to_string(a.hidden) +
                " / num_attention_heads " + std::to_string(a.n_heads) + ")";
  if (!present(config, fraction_key) && fraction == 1.0)
    throw Error(path + ": " + head_dim + " is odd; RoPE turns dimensions in pairs, so it must be even");
  throw Error(path + ": " + fraction_key + " " + short_number(fraction) +
              (present(config, fraction_key) ? "" : " (the default)") + " of " + head_dim + " gives " +
              std::to_string(rotary_dim) + " rotary dims (need an even number above 0)");
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
