#include "harness/common/config_reader.h"

#include <algorithm>
#include <cmath>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"

namespace kvevict {

ConfigObject::ConfigObject(const nlohmann::json& value, std::string where, std::vector<std::string> keys,
                           std::string prefix)
    : value_(value), where_(std::move(where)), prefix_(std::move(prefix)), keys_(std::move(keys)) {
  if (!value_.is_object())
    throw Error(where_ + (prefix_.empty() ? ": must be a JSON object"
                                          : ": key \"" + prefix_.substr(0, prefix_.size() - 1) + "\" must be an object"));
  for (const auto& item : value_.items()) {
    if (std::find(keys_.begin(), keys_.end(), item.key()) != keys_.end()) continue;
    std::string known;
    for (const auto& key : keys_) known += (known.empty() ? "" : ", ") + key;
    throw Error(where_ + ": unknown key \"" + prefix_ + item.key() + "\" (known: " + known + ")");
  }
}

void ConfigObject::check_declared(const std::string& key) const {
  if (std::find(keys_.begin(), keys_.end(), key) == keys_.end())
    throw Error(where_ + ": the reader asks for key \"" + prefix_ + key + "\", which it did not declare");
}

bool ConfigObject::has(const std::string& key) const {
  check_declared(key);
  return value_.contains(key) && !value_[key].is_null();
}

const nlohmann::json& ConfigObject::raw(const std::string& key) const {
  static const nlohmann::json null;
  return has(key) ? value_[key] : null;
}

std::string ConfigObject::name(const std::string& key) const { return where_ + ": key \"" + prefix_ + key + "\""; }

int ConfigObject::integer(const std::string& key, int fallback, long long low, long long high) const {
  if (!has(key)) return fallback;
  return static_cast<int>(json_int(value_[key], where_, prefix_ + key, low, high));
}

double ConfigObject::number(const std::string& key, double fallback, double low, double high) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  if (!v.is_number()) throw Error(name(key) + " must be a number, not " + v.dump());
  const double x = v.get<double>();
  if (!(std::isfinite(x) && x >= low && x <= high))
    throw Error(name(key) + ": " + v.dump() + " is outside [" + short_number(low) + ", " + short_number(high) + "]");
  return x;
}

bool ConfigObject::flag(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  if (!v.is_boolean()) throw Error(name(key) + " must be true or false, not " + v.dump());
  return v.get<bool>();
}

std::string ConfigObject::text(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  if (!v.is_string()) throw Error(name(key) + " must be a string, not " + v.dump());
  return v.get<std::string>();
}

std::vector<std::string> ConfigObject::texts(const std::string& key, const std::vector<std::string>& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  std::vector<std::string> out;
  if (v.is_array())
    for (const auto& item : v) {
      if (!item.is_string()) throw Error(name(key) + " must be a list of strings, not " + v.dump());
      out.push_back(item.get<std::string>());
    }
  else
    throw Error(name(key) + " must be a list of strings, not " + v.dump());
  return out;
}

std::vector<int> ConfigObject::integers(const std::string& key, const std::vector<int>& fallback, long long low,
                                        long long high) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  if (!v.is_array()) throw Error(name(key) + " must be a list of integers, not " + v.dump());
  std::vector<int> out;
  for (const auto& item : v) out.push_back(static_cast<int>(json_int(item, where_, prefix_ + key, low, high)));
  return out;
}

std::vector<double> ConfigObject::numbers(const std::string& key, const std::vector<double>& fallback, double low,
                                          double high) const {
  if (!has(key)) return fallback;
  const auto& v = value_[key];
  if (!v.is_array()) throw Error(name(key) + " must be a list of numbers, not " + v.dump());
  std::vector<double> out;
  for (const auto& item : v) {
    if (!item.is_number()) throw Error(name(key) + " must be a list of numbers, not " + v.dump());
    const double x = item.get<double>();
    if (!(std::isfinite(x) && x >= low && x <= high))
      throw Error(name(key) + ": " + item.dump() + " is outside [" + short_number(low) + ", " + short_number(high) + "]");
    out.push_back(x);
  }
  return out;
}

}  // namespace kvevict
