// `kvevict analyze`: the H2O paper's observations about attention, measured on any
// supported model over a text, a tokens file or a task's requests.
//   - sparsity (the paper's 1%-of-row-maximum rule), the power-law fit of accumulated
//     attention and the share of it the top 20% of keys hold (definitions in
//     ../shared/data/golden/README.md, "Attention statistics");
//   - persistence of heavy hitters: overlap of the top-k keys by accumulated attention
//     at step t and at step t + delta;
//   - attention recall: the share of full attention each policy's kept set holds, with
//     the policy run through the policy driver alongside full attention in every layer.
// A DMC model (docs/DMC.md) runs its parallel form instead and reports, per layer and KV
// head, the compression ratio tokens / slots; the attention statistics over merged slots
// are not computed (a note says so).
// The model runs with full attention (FullAttention with an observer), which computes
// each layer in blocks of query rows and hands every block to the analysis before
// dropping it: memory is O(heads x block x T), never [layers, heads, T, T]. Under a
// sliding window only the keys a query sees count.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "policies/registry.h"

namespace kvevict {

struct AnalyzeOptions {
  std::vector<std::string> recall_policies = default_recall_policies();
  std::vector<double> recall_budgets = {0.1, 0.2, 0.3, 0.5};
  PolicyOptions policy_options;  // window, stride, ... for the recall policies (budget set per run)
  std::vector<int> persistence_deltas = {1, 4, 16, 64};
  double persistence_k_ratio = 0.1;  // heavy-hitter set size as a share of the sequence
  int block_rows = 256;              // query rows per attention block
};

// Averages over sequences (and heads where the statistic is per head).
struct HeadStatistics {
  double sparse = 0, entries = 0;  // entries below 1% of the row maximum / causal entries
  double slope = 0, intercept = 0, r2 = 0, top20 = 0;
  int fits = 0;  // sequences behind slope / r2 / top20
};

struct RecallStatistics {
  double recall_sum = 0, attended_sum = 0;  // over rows x query heads
  double rows = 0;
  double recall() const { return rows ? recall_sum / rows : 0; }
  double attended() const { return rows ? attended_sum / rows : 0; }  // keys besides the query itself
};

struct LayerStatistics {
  std::vector<HeadStatistics> heads;
  std::map<int, std::pair<double, double>> persistence;  // delta -> (overlap sum, count)
  std::map<std::string, std::map<double, RecallStatistics>> recall;  // policy -> budget -> stats
  // The longest sequence's accumulated attention sorted descending, mean over heads.
  std::vector<double> rank_profile;
  // A DMC model: per KV head, tokens and the cache slots they became, summed over sequences.
  std::vector<std::pair<int64_t, int64_t>> dmc_tokens_slots;
  // tokens / slots per KV head (empty without DMC).
  std::vector<double> dmc_compression() const;

  double sparsity() const;
  double slope() const;
  double intercept() const;
  double r2() const;
  double top20() const;
  double persistence_at(int delta) const;
};

struct AttentionAnalysis {
  std::vector<LayerStatistics> layers;
  int sequences = 0;
  int64_t tokens = 0;
  std::vector<std::string> notes;  // policies skipped, and why
  nlohmann::json to_json(const AnalyzeOptions& options) const;
  // Long format: layer,head,statistic,policy,budget,delta,value ("all" heads: the layer).
  std::string to_csv(const AnalyzeOptions& options) const;
  // sparsity_per_layer.svg, powerlaw_rank.svg, recall_vs_budget.svg; returns the paths.
  std::vector<std::string> write_plots(const AnalyzeOptions& options, const std::string& dir) const;
};

// The attention backend analyze runs with --kv-quant: the model's attention over a KIVI
// cache in the stream protocol, row by row as decode mode computes it, each row's scaled
// logits and probabilities handed to observer (first = the row's position, rows = 1).
std::unique_ptr<AttentionBackend> make_observed_kivi_attention(const KvQuantSpec& spec, torch::ScalarType dtype,
                                                              AttentionObserver observer);

// Runs `model` over each sequence with full attention (over a KIVI cache when
// options.policy_options.kv_quant is on) and collects the statistics.
AttentionAnalysis analyze_attention(const Model& model, const std::vector<std::vector<int>>& sequences,
                                    const AnalyzeOptions& options);

}  // namespace kvevict
