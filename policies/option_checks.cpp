#include "policies/option_checks.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// -1 is "not given"; anything else must be a finite number in [low, high] (NaN fails).
void check_optional_fraction(const char* flag, double value, double low, bool low_open, double high) {
  if (value == -1) return;
  const bool above_low = low_open ? value > low : value >= low;
  if (!(above_low && value <= high))
    throw Error(std::string(flag) + " " + number(value) + " is outside " + (low_open ? "(" : "[") +
                number(low) + ", " + number(high) + "]");
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
  check_at_least("--n-sink", o.n_sink, 0);
  check_at_least("--window", o.window, 1);
  // An even kernel has no centre: the pooled window would lean to one side.
  if (o.kernel < 1 || o.kernel % 2 == 0)
    throw Error("--kernel " + std::to_string(o.kernel) + " must be an odd number >= 1 (1: no pooling)");
  if (o.pooling != "avg" && o.pooling != "max")
    throw Error("--pooling \"" + o.pooling + "\" is not avg or max");
  if (o.group_reduce != "mean" && o.group_reduce != "max")
    throw Error("--group-reduce \"" + o.group_reduce + "\" is not mean or max");
  if (!(o.pyramid_beta >= 1 && std::isfinite(o.pyramid_beta)))
    throw Error("pyramid beta " + number(o.pyramid_beta) + " must be a finite number >= 1");
  check_at_least("--summary", o.summary, 1);
}

}  // namespace kvevict
