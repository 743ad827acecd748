#include "policies/budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "harness/common/errors.h"
#include "harness/common/limits.h"
#include "harness/common/text.h"

namespace kvevict {
namespace {

// -1 is "not given"; anything else must be a finite number in [low, high] (NaN fails).
void check_optional_fraction(const char* key, double value, double low, bool low_open, double high) {
  if (value == -1) return;
  const bool above_low = low_open ? value > low : value >= low;
  if (!(above_low && value <= high))
    throw Error(std::string(key) + " " + short_number(value) + " is outside " + (low_open ? "(" : "[") +
                short_number(low) + ", " + short_number(high) + "]");
}

// x rounded up to 3 significant digits, so the value printed still keeps a token.
double round_up_3_digits(double x) {
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 2);
  return std::ceil(x / unit) * unit;
}

// The double nearest to x's 12-significant-digit decimal: products such as 0.7*0.2
// (0.13999999999999999) become the 0.14 a user would have typed, so int(h*L) agrees
// with the paper's int(0.14*L).
double snap_decimal(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.12g", x);
  return std::strtod(text, nullptr);
}

std::string needs_a_budget(const BudgetSpec& spec, const std::string& policy) {
  const BudgetKeys& k = *spec.keys;
  return "policy " + policy + " needs a budget (" + k.ratio + ", " + k.tokens + " or " + k.heavy_ratio + "/" +
         k.recent_ratio + ")";
}

int paper_part(double ratio, int length) { return static_cast<int>(std::max(0.0, ratio) * length); }

}  // namespace

void check_budget_spec(const BudgetSpec& spec) {
  const BudgetKeys& k = *spec.keys;
  check_optional_fraction(k.ratio, spec.ratio, 0, true, 1);
  if (spec.ratio > 0 && static_cast<int64_t>(spec.ratio * kMaxModelPositions) == 0)
    refuse_zero_budget(spec, kMaxModelPositions);
  if (spec.tokens != -1 && spec.tokens < 1)
    throw Error(std::string(k.tokens) + " " + std::to_string(spec.tokens) + " must be at least 1");
  if (spec.ratio != -1 && spec.tokens != -1)
    throw Error(std::string(k.ratio) + " and " + k.tokens + " are exclusive: give the budget one way");
  check_optional_fraction(k.heavy_share, spec.heavy_share, 0, false, 1);
  check_optional_fraction(k.heavy_ratio, spec.heavy_ratio, 0, false, 1);
  check_optional_fraction(k.recent_ratio, spec.recent_ratio, 0, false, 1);
  if (spec.heavy_ratio >= 0 && spec.recent_ratio >= 0 && spec.heavy_ratio + spec.recent_ratio > 1)
    throw Error(std::string(k.heavy_ratio) + " + " + k.recent_ratio + " must lie in (0, 1]");
}

void check_budget_fits(const BudgetSpec& spec, int length, int sink, const std::string& policy) {
  if (!spec.is_set()) throw Error(needs_a_budget(spec, policy));
  // A token budget at or above the sequence's length keeps the whole sequence (nothing
  // is evicted), as a ratio of 1 does: one rule for eval, sweeps and the server.
  // A ratio budget may round to 0 tokens on a short request (int(ratio * T), as the
  // paper): the cache then keeps nothing between steps and each query sees itself only.
  if (spec.tokens > 0 && spec.tokens < sink)
    throw Error("budget of " + std::to_string(spec.tokens) + " tokens is smaller than the " + std::to_string(sink) +
                " sink tokens of " + policy);
}

int total_budget_tokens(const BudgetSpec& spec, int length, const std::string& policy) {
  if (spec.has_paper_ratios()) return paper_part(spec.heavy_ratio, length) + paper_part(spec.recent_ratio, length);
  if (spec.tokens > 0) return spec.tokens;
  if (spec.ratio > 0) return static_cast<int>(spec.ratio * length);
  throw Error(needs_a_budget(spec, policy));
}

Budget split_budget(const BudgetSpec& spec, int length, int sink, double default_share, const std::string& policy) {
  Budget budget;
  budget.sink = sink;
  if (spec.has_paper_ratios()) {
    budget.recent = paper_part(spec.recent_ratio, length);
    budget.capacity = paper_part(spec.heavy_ratio, length) + budget.recent + budget.sink;
    return budget;
  }
  const int total = total_budget_tokens(spec, length, policy);
  // A ratio budget on a short request can round below the sink count: the sinks then
  // take the whole budget (a token budget that small is refused by check_budget_fits).
  budget.sink = std::min(budget.sink, total);
  const double share = spec.heavy_share >= 0 ? spec.heavy_share : default_share;
  const int rest = std::max(0, total - budget.sink);
  const int heavy = static_cast<int>(rest * share);
  budget.recent = rest - heavy;
  budget.capacity = total;
  return budget;
}

std::pair<double, double> heavy_recent_ratios(const BudgetSpec& spec, double default_share) {
  if (spec.has_paper_ratios()) return {std::max(0.0, spec.heavy_ratio), std::max(0.0, spec.recent_ratio)};
  if (spec.ratio > 0) {
    const double share = spec.heavy_share >= 0 ? spec.heavy_share : default_share;
    return {snap_decimal(share * spec.ratio), snap_decimal((1 - share) * spec.ratio)};
  }
  return {-1, -1};
}

Budget paper_split_budget(const BudgetSpec& spec, int length, double default_share, const std::string& policy) {
  const auto [heavy_ratio, recent_ratio] = heavy_recent_ratios(spec, default_share);
  if ((spec.tokens > 0 && !spec.has_paper_ratios()) || heavy_ratio < 0)
    return split_budget(spec, length, 0, default_share, policy);  // tokens; or no budget, which it refuses
  Budget budget;
  budget.recent = static_cast<int>(recent_ratio * length);
  budget.capacity = static_cast<int>(heavy_ratio * length) + budget.recent;
  return budget;
}

std::string budget_text(const BudgetSpec& spec) {
  const BudgetKeys& k = *spec.keys;
  if (spec.has_paper_ratios())
    return std::string(k.heavy_ratio) + " " + short_number(std::max(0.0, spec.heavy_ratio)) + " + " + k.recent_ratio +
           " " + short_number(std::max(0.0, spec.recent_ratio));
  if (spec.tokens > 0) return std::string(k.tokens) + " " + std::to_string(spec.tokens);
  return std::string(k.ratio) + " " + short_number(spec.ratio);
}

void refuse_zero_budget(const BudgetSpec& spec, int64_t longest) {
  throw Error(budget_text(spec) + " keeps 0 tokens even on a request of " + std::to_string(longest) +
              " tokens (int(ratio * length) = 0), " +
              (longest == kMaxModelPositions ? "the longest context a model may have" : "this model's whole context") +
              "; the smallest budget that keeps a token is " + short_number(round_up_3_digits(1.0 / longest)));
}

}  // namespace kvevict
