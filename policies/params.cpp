#include "policies/params.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "harness/common/errors.h"

namespace kvevict {

namespace {

std::string flag_for(const char* key) {
  std::string flag = std::string("--") + key;
  for (auto& c : flag)
    if (c == '_') c = '-';
  return flag;
}

// Shortest text that reads back as the same double ("20", not "2e+01").
std::string shortest(double x) {
  char text[32];
  if (x == std::floor(x) && std::fabs(x) < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", x);
    return text;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, x);
    if (std::strtod(text, nullptr) == x) break;
  }
  return text;
}

bool parse_double(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(text.c_str(), &end);
  return errno == 0 && *end == '\0' && std::isfinite(*out);
}

std::string number_text(double min) { return shortest(min); }

}  // namespace

ParamSpec ParamSpec::integer(const char* key, long long default_value, const char* help) {
  ParamSpec s;
  s.key_ = key;
  s.flag_ = flag_for(key);
  s.help_ = help;
  s.kind_ = Kind::Integer;
  s.default_ = std::to_string(default_value);
  return s;
}

ParamSpec ParamSpec::real(const char* key, double default_value, const char* help) {
  ParamSpec s = integer(key, 0, help);
  s.kind_ = Kind::Real;
  s.default_ = shortest(default_value);
  return s;
}

ParamSpec ParamSpec::choice(const char* key, std::vector<std::string> choices, const char* help) {
  ParamSpec s = integer(key, 0, help);
  s.kind_ = Kind::Choice;
  s.choices_ = std::move(choices);
  s.default_ = s.choices_.at(0);
  return s;
}

ParamSpec ParamSpec::seed(const char* key, const char* help) {
  ParamSpec s = integer(key, 0, help);
  s.kind_ = Kind::Seed;
  return s;
}

ParamSpec ParamSpec::text(const char* key, const char* help) {
  ParamSpec s = integer(key, 0, help);
  s.kind_ = Kind::Text;
  s.default_ = "";
  return s;
}

ParamSpec ParamSpec::at_least(double min) const {
  ParamSpec s = *this;
  s.min_ = min;
  return s;
}

ParamSpec ParamSpec::at_most(double max) const {
  ParamSpec s = *this;
  s.max_ = max;
  return s;
}

ParamSpec ParamSpec::odd() const {
  ParamSpec s = *this;
  s.odd_ = true;
  return s;
}

ParamSpec ParamSpec::or_value(long long special) const {
  ParamSpec s = *this;
  s.has_special_ = true;
  s.special_ = special;
  return s;
}

ParamSpec ParamSpec::flag(const char* cli_flag) const {
  ParamSpec s = *this;
  s.flag_ = cli_flag;
  return s;
}

ParamSpec ParamSpec::per_run_seed() const {
  ParamSpec s = *this;
  s.run_seed_ = true;
  return s;
}

std::string ParamSpec::check(const std::string& text, const std::string& where) const {
  const auto refuse = [&](const std::string& expected) -> std::string {
    throw Error(where + ": \"" + text + "\" is not " + expected);
  };
  std::string range;
  if (min_ > -1e300) range += " >= " + number_text(min_);
  if (max_ < 1e300) range += (range.empty() ? " <= " : " and <= ") + number_text(max_);
  if (has_special_) range += " (or " + std::to_string(special_) + ")";
  switch (kind_) {
    case Kind::Choice: {
      for (const auto& c : choices_)
        if (text == c) return text;
      std::string known;
      for (const auto& c : choices_) known += (known.empty() ? "" : ", ") + c;
      return refuse("one of " + known);
    }
    case Kind::Text: {
      for (const char c : text)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == ';' || c == '=')
          return refuse("a text without control characters, ';' or '='");
      return text;
    }
    case Kind::Seed: {
      char* end = nullptr;
      errno = 0;
      const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || text[0] == '-' || text[0] == '+' || errno != 0 || *end != '\0')
        return refuse("an unsigned 64-bit integer");
      return std::to_string(value);
    }
    case Kind::Real: {
      double value = 0;
      if (!parse_double(text, &value)) return refuse("a number");
      if (value < min_ || value > max_) return refuse("a number" + range);
      return shortest(value);
    }
    case Kind::Integer: {
      double value = 0;
      const std::string expected = std::string(odd_ ? "an odd integer" : "an integer") + range;
      if (!parse_double(text, &value) || value != std::floor(value) || std::fabs(value) > 1e15)
        return refuse(expected);
      const long long n = static_cast<long long>(value);
      if (has_special_ && n == special_) return std::to_string(n);
      if (value < min_ || value > max_ || (odd_ && n % 2 == 0)) return refuse(expected);
      return std::to_string(n);
    }
  }
  return text;
}

std::string ParamSpec::describe() const {
  std::string out = help_;
  if (kind_ == Kind::Choice) {
    std::string known;
    for (const auto& c : choices_) known += (known.empty() ? "" : " or ") + c;
    out += " (" + known + ")";
  } else if (min_ > -1e300 || max_ < 1e300 || odd_) {
    std::string range;
    if (min_ > -1e300) range += ">= " + number_text(min_);
    if (max_ < 1e300) range += (range.empty() ? "<= " : ", <= ") + number_text(max_);
    out += std::string(" (") + (odd_ ? "odd, " : "") + range +
           (has_special_ ? ", or " + std::to_string(special_) : "") + ")";
  }
  return out;
}

void PolicyParams::set(const ParamSpec& spec, const std::string& text, const std::string& where) {
  values_[spec.key()] = spec.check(text, where);
}

void PolicyParams::set(const ParamSpec& spec, double value) { set(spec, shortest(value), spec.key()); }

long long PolicyParams::integer(const ParamSpec& spec) const {
  return std::stoll(text(spec));
}

double PolicyParams::real(const ParamSpec& spec) const { return std::strtod(text(spec).c_str(), nullptr); }

std::string PolicyParams::text(const ParamSpec& spec) const {
  const auto it = values_.find(spec.key());
  return it == values_.end() ? spec.default_text() : it->second;
}

std::uint64_t PolicyParams::seed(const ParamSpec& spec) const { return std::stoull(text(spec)); }

std::string PolicyParams::to_string() const {
  std::string out;
  for (const auto& [key, value] : values_) out += (out.empty() ? "" : ";") + key + "=" + value;
  return out;
}

}  // namespace kvevict
