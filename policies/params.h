// A policy's tunable parameters, each declared once where it is used (one line: key,
// default, help, range). The CLI flags, the sweep's "policy_options" keys and the
// range checks all come from these declarations, so a new parameter is one line.
//
// Plain C++: no LibTorch, no CLI11.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvevict {

class ParamSpec {
 public:
  enum class Kind { Integer, Real, Choice, Seed, Text };

  // The builders: key is the sweep key ("n_sink"); the flag is "--" + key with '-' for '_'.
  static ParamSpec integer(const char* key, long long default_value, const char* help);
  static ParamSpec real(const char* key, double default_value, const char* help);
  static ParamSpec choice(const char* key, std::vector<std::string> choices, const char* help);  // default: the first
  static ParamSpec seed(const char* key, const char* help);  // unsigned 64 bits, default 0
  // Free text, default "" (a file path: duo-attention's pattern_file); a value holds no
  // control character, ';' or '=' (PolicyParams::to_string joins "key=value" with ';').
  static ParamSpec text(const char* key, const char* help);

  // Range refinements, chained onto a builder.
  ParamSpec at_least(double min) const;
  ParamSpec at_most(double max) const;
  ParamSpec odd() const;
  ParamSpec or_value(long long special) const;  // one value allowed outside the range (e.g. -1: automatic)
  ParamSpec flag(const char* cli_flag) const;   // another CLI flag than the key's
  // Set from each run's seed (the sweep's "seeds" axis) instead of the policy_options key.
  ParamSpec per_run_seed() const;

  const std::string& key() const { return key_; }
  const std::string& cli_flag() const { return flag_; }
  const std::string& help() const { return help_; }
  const std::string& default_text() const { return default_; }
  Kind kind() const { return kind_; }
  bool takes_run_seed() const { return run_seed_; }
  // The canonical text of a value (e.g. "8" for 8.0 given to an integer), or throws
  // kvevict::Error naming `where` (a flag or config key) when it is not a valid value.
  std::string check(const std::string& text, const std::string& where) const;
  // The help line with its range and default.
  std::string describe() const;

 private:
  std::string key_, flag_, help_, default_;
  Kind kind_ = Kind::Integer;
  double min_ = -1e300, max_ = 1e300;
  bool odd_ = false, has_special_ = false, run_seed_ = false;
  long long special_ = 0;
  std::vector<std::string> choices_;
};

// Values of parameters set explicitly; the others read as their declared default.
// Setting checks the value against the declaration, so a held value is always valid.
class PolicyParams {
 public:
  void set(const ParamSpec& spec, const std::string& text, const std::string& where);
  void set(const ParamSpec& spec, double value);  // integers too: 4 reads as "4"
  // By key, for code and tests that do not see the declaration (defined in registry.cpp).
  void set(const std::string& key, double value);
  void set(const std::string& key, const std::string& text);
  void clear(const ParamSpec& spec) { values_.erase(spec.key()); }
  bool is_set(const ParamSpec& spec) const { return values_.count(spec.key()) > 0; }
  long long integer(const ParamSpec& spec) const;
  double real(const ParamSpec& spec) const;
  std::string text(const ParamSpec& spec) const;
  std::uint64_t seed(const ParamSpec& spec) const;
  // "key=value" of every explicitly set parameter, in key order, joined by ';'.
  std::string to_string() const;

 private:
  std::map<std::string, std::string> values_;
};

// Every parameter some registered policy declares, each once, in registry order
// (defined in registry.cpp).
const std::vector<const ParamSpec*>& all_policy_params();
const ParamSpec* find_policy_param(const std::string& key);

}  // namespace kvevict
