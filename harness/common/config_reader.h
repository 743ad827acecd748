// One JSON object of a config file, read with every key it may hold declared up front: a
// key outside them (a typo such as "decode_step") is refused instead of silently ignored,
// and a value of the wrong type or out of range is an error naming the file and the key
// as the user wrote it. Every config reader reads through it: the sweep grid, its
// "slurm" block, the "analyze" entries and the bench configs.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvevict {

class ConfigObject {
 public:
  // `where` names the file (and the entry, e.g. `x.json: analyze entry "copa"`);
  // `prefix` goes before every key in messages ("slurm." for the sweep's slurm block).
  // Throws kvevict::Error when `value` is not an object or holds a key not in `keys`.
  // `value` is read in place: it must outlive the reader. A null value reads as absent.
  ConfigObject(const nlohmann::json& value, std::string where, std::vector<std::string> keys,
               std::string prefix = "");

  bool has(const std::string& key) const;
  // The value as given (null when absent); for readers with rules of their own.
  const nlohmann::json& raw(const std::string& key) const;
  // `WHERE: key "PREFIXKEY"`, the start of an error about that key.
  std::string name(const std::string& key) const;

  // Each returns the fallback when the key is absent.
  int integer(const std::string& key, int fallback, long long low, long long high) const;
  double number(const std::string& key, double fallback, double low, double high) const;  // finite
  bool flag(const std::string& key, bool fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> texts(const std::string& key, const std::vector<std::string>& fallback) const;
  std::vector<int> integers(const std::string& key, const std::vector<int>& fallback, long long low,
                            long long high) const;
  std::vector<double> numbers(const std::string& key, const std::vector<double>& fallback, double low,
                              double high) const;

 private:
  const nlohmann::json& value_;
  std::string where_, prefix_;
  std::vector<std::string> keys_;
  void check_declared(const std::string& key) const;  // a reader asking for an undeclared key is a bug
};

}  // namespace kvevict
