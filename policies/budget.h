// Cache budgets: what a user asks for (BudgetSpec), the rules it must follow, and how it
// resolves to tokens for one sequence (Budget). Every budget rule lives here, once; the
// policies only choose how a resolved total splits (PyramidKV per layer, the paper's
// heavy/recent split, sinks). Errors name the field as the user wrote it: a flag on the
// command line, a key in a sweep config or a server request.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

namespace kvevict {

// The names of the budget fields where the user wrote them.
struct BudgetKeys {
  const char* ratio;
  const char* tokens;
  const char* heavy_share;
  const char* heavy_ratio;
  const char* recent_ratio;
};
inline constexpr BudgetKeys kBudgetFlags{"--budget", "--budget-tokens", "--heavy-share", "--heavy-ratio",
                                         "--recent-ratio"};
inline constexpr BudgetKeys kSweepBudgetKeys{"budgets", "budget_tokens", "heavy_shares", "heavy_ratio",
                                             "recent_ratio"};
// A server request's "kvevict" object (harness/server/request.h).
inline constexpr BudgetKeys kRequestBudgetKeys{"kvevict.budget", "kvevict.budget_tokens", "kvevict.heavy_share",
                                               "kvevict.heavy_ratio", "kvevict.recent_ratio"};

// How big the cache may be. Normally one of ratio / tokens / (heavy_ratio, recent_ratio)
// is set; unset fields are negative (-1).
struct BudgetSpec {
  double ratio = -1;         // fraction of the sequence length (the paper's convention)
  int tokens = -1;           // absolute token count
  double heavy_share = -1;   // share of the budget for heavy hitters (-1: the policy's default)
  double heavy_ratio = -1;   // the paper's own parameters, as fractions of the length
  double recent_ratio = -1;
  const BudgetKeys* keys = &kBudgetFlags;  // for error messages only

  bool is_set() const { return ratio > 0 || tokens > 0 || has_paper_ratios(); }
  // Given as the paper's heavy and recent ratios (either of them).
  bool has_paper_ratios() const { return heavy_ratio >= 0 || recent_ratio >= 0; }
  // Resolves against the sequence length (a ratio, or the paper's ratios).
  bool is_ratio() const { return ratio > 0 || has_paper_ratios(); }
};

// A resolved per-layer (or per-head) budget, in tokens.
struct Budget {
  bool unlimited = false;
  int capacity = 0;  // tokens kept after each step (sinks + heavy + recent)
  int recent = 0;    // the most recent tokens, always kept
  int sink = 0;      // the first tokens, always kept
  // The question-agnostic protocol: the question's question_len tokens from position
  // question_from enter after the context was compressed and are not compressed
  // themselves; from then on the cache holds the budget plus the question.
  int question_from = 0;
  int question_len = 0;

  // False while the newest token is one of the question's: nothing is evicted then.
  bool compresses_after(int position) const {
    return question_len == 0 || position < question_from || position >= question_from + question_len;
  }
  // The capacity once the token at `position` is in.
  int capacity_after(int position) const {
    return capacity + (question_len > 0 && position >= question_from ? question_len : 0);
  }
};

// The rules that need no sequence: ranges, one way of asking, a ratio that can keep a
// token at all. Throws kvevict::Error naming the field.
void check_budget_spec(const BudgetSpec& spec);

// The rules for one sequence of `length` tokens (ratios refer to it) and a policy with
// `sink` sink tokens: a budget is given and a token budget holds the sinks (a token budget
// longer than the sequence keeps it whole). `policy` names the policy in the message.
void check_budget_fits(const BudgetSpec& spec, int length, int sink, const std::string& policy);

// The whole budget in tokens: int(ratio * length), the token count, or the paper's
// int(heavy_ratio * length) + int(recent_ratio * length).
int total_budget_tokens(const BudgetSpec& spec, int length, const std::string& policy);

// The usual split: `sink` sinks (fewer when a ratio budget rounds below them), then the
// rest int(share * rest) heavy and the remainder recent; the paper's ratios give
// int(h*L) heavy and int(r*L) recent, plus the sinks.
Budget split_budget(const BudgetSpec& spec, int length, int sink, double default_share, const std::string& policy);

// The heavy-hitter and recent ratios of the budget however it was asked for (the paper's
// ratios, or a ratio B with heavy share S as S*B and (1-S)*B, each snapped to the decimal
// it stands for, so 0.5*0.2 is the paper's 0.1). Negative when the budget is in tokens.
std::pair<double, double> heavy_recent_ratios(const BudgetSpec& spec, double default_share);

// The paper's split for the H2O simulations: heavy = int(h*L) and recent = int(r*L)
// separately, for every way of asking; a token budget splits as split_budget does.
Budget paper_split_budget(const BudgetSpec& spec, int length, double default_share, const std::string& policy);

// A ratio budget may keep 0 tokens on a short request (int(ratio * T), the paper's
// convention), but one that keeps 0 tokens even on a request of `longest` tokens can never
// keep one. The error names the budget as the user wrote it and the smallest ratio that
// keeps a token.
[[noreturn]] void refuse_zero_budget(const BudgetSpec& spec, int64_t longest);
// The budget as the user wrote it: "--budget 0.2", "--heavy-ratio 0.1 + --recent-ratio 0.1".
std::string budget_text(const BudgetSpec& spec);

}  // namespace kvevict
