#include "policies/option_checks.h"

#include <cmath>
#include <string>

#include "harness/common/errors.h"
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

void check_at_least(const char* flag, long long value, long long low) {
  if (value < low)
    throw Error(std::string(flag) + " " + std::to_string(value) + " must be at least " + std::to_string(low));
}

}  // namespace

void check_policy_options(const PolicyOptions& o) {
  const BudgetSpec& b = o.budget;
  check_optional_fraction("--budget", b.ratio, 0, true, 1);
  if (b.tokens != -1) check_at_least("--budget-tokens", b.tokens, 1);
  if (b.ratio != -1 && b.tokens != -1)
    throw Error("--budget and --budget-tokens are exclusive: give the budget one way");
  check_optional_fraction("--heavy-share", b.heavy_share, 0, false, 1);
  check_optional_fraction("--heavy-ratio", b.heavy_ratio, 0, false, 1);
  check_optional_fraction("--recent-ratio", b.recent_ratio, 0, false, 1);
  // The policies' own parameters are checked against their declarations as they are set
  // (policies/params.h), so every value held in o.params is already in range.
}

}  // namespace kvevict
