#include "policies/option_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "harness/common/errors.h"
#include "harness/common/limits.h"
#include "harness/common/text.h"

namespace kvevict {
namespace {

// -1 is "not given"; anything else must be a finite number in [low, high] (NaN fails).
void check_optional_fraction(const char* flag, double value, double low, bool low_open, double high) {
  if (value == -1) return;
  const bool above_low = low_open ? value > low : value >= low;
  if (!(above_low && value <= high))
    throw Error(std::string(flag) + " " + short_number(value) + " is outside " + (low_open ? "(" : "[") +
                short_number(low) + ", " + short_number(high) + "]");
}

// x rounded up to 3 significant digits, so the value printed still keeps a token.
double round_up_3_digits(double x) {
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 2);
  return std::ceil(x / unit) * unit;
}

// The budget's flag(s) and ratio(s) as the user gave them, for the message.
std::string ratio_text(const BudgetSpec& b, const std::string& flag) {
  if (b.heavy_ratio >= 0 || b.recent_ratio >= 0)
    return "--heavy-ratio " + short_number(std::max(0.0, b.heavy_ratio)) + " + --recent-ratio " +
           short_number(std::max(0.0, b.recent_ratio));
  return flag + " " + short_number(b.ratio);
}

[[noreturn]] void refuse_zero_budget(const std::string& what, int64_t longest) {
  throw Error(what + " keeps 0 tokens even on a request of " + std::to_string(longest) +
              " tokens (int(ratio * length) = 0), " +
              (longest == kMaxModelPositions ? "the longest context a model may have" : "this model's whole context") +
              "; the smallest budget that keeps a token is " + short_number(round_up_3_digits(1.0 / longest)));
}

void check_at_least(const char* flag, long long value, long long low) {
  if (value < low)
    throw Error(std::string(flag) + " " + std::to_string(value) + " must be at least " + std::to_string(low));
}

}  // namespace

void check_policy_options(const PolicyOptions& o) {
  const BudgetSpec& b = o.budget;
  check_optional_fraction("--budget", b.ratio, 0, true, 1);
  if (b.ratio > 0) check_budget_ratio_keeps_a_token(b.ratio, "--budget");
  if (b.tokens != -1) check_at_least("--budget-tokens", b.tokens, 1);
  if (b.ratio != -1 && b.tokens != -1)
    throw Error("--budget and --budget-tokens are exclusive: give the budget one way");
  check_optional_fraction("--heavy-share", b.heavy_share, 0, false, 1);
  check_optional_fraction("--heavy-ratio", b.heavy_ratio, 0, false, 1);
  check_optional_fraction("--recent-ratio", b.recent_ratio, 0, false, 1);
  // The policies' own parameters are checked against their declarations as they are set
  // (policies/params.h), so every value held in o.params is already in range.
}

void check_budget_ratio_keeps_a_token(double ratio, const std::string& flag) {
  if (static_cast<int64_t>(ratio * kMaxModelPositions) == 0) refuse_zero_budget(flag + " " + short_number(ratio), kMaxModelPositions);
}

void check_budget_keeps_a_token(const Policy& policy, int64_t max_positions, const std::string& flag) {
  const BudgetSpec& b = policy.options().budget;
  const bool ratio_budget = b.ratio > 0 || b.heavy_ratio >= 0 || b.recent_ratio >= 0;
  if (policy.keeps_everything() || !ratio_budget || max_positions < 1) return;
  const int longest = static_cast<int>(std::min<int64_t>(max_positions, kMaxModelPositions));
  SequenceShape shape;
  shape.length = longest;
  shape.prefill_len = longest;
  const Budget budget = policy.layer_budget(0, shape);
  if (budget.unlimited || budget.capacity > 0) return;
  refuse_zero_budget(ratio_text(b, flag), longest);
}

}  // namespace kvevict
