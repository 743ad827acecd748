// The policy and budget flags every subcommand shares, so they read the same
// everywhere: --policy --budget --budget-tokens --heavy-share --heavy-ratio
// --recent-ratio --n-sink --window --kernel --pooling --seed --group-reduce.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "harness/cli/cli_checks.h"
#include "policies/registry.h"

namespace kvevict {

struct PolicyFlags {
  std::string policy = "full";
  PolicyOptions options;
  void add_to(CLI::App& app) {
    app.add_option("--policy", policy, "eviction policy: " + known_policies() +
                   "; SCORED+PATTERN (e.g. h2o+sparse-strided) adds a scored policy's heavy hitters to a static pattern")
        ->capture_default_str();
    app.add_option("--budget", options.budget.ratio, "cache budget as a ratio of the sequence length, in (0, 1]")
        ->check(cli::finite_range(0, 1, true));
    app.add_option("--budget-tokens", options.budget.tokens, "cache budget as an absolute token count")->check(cli::at_least(1));
    app.add_option("--heavy-share", options.budget.heavy_share,
                   "share of the budget given to heavy hitters (default: the policy's)");
    app.add_option("--heavy-ratio", options.budget.heavy_ratio, "the paper's heavy-hitter ratio of the length");
    app.add_option("--recent-ratio", options.budget.recent_ratio, "the paper's recent-window ratio of the length");
    app.add_option("--n-sink", options.n_sink, "streamingllm: sink tokens")->capture_default_str();
    app.add_option("--window", options.window, "snapkv/pyramidkv/scissorhands: observation window")->capture_default_str();
    app.add_option("--kernel", options.kernel, "snapkv/pyramidkv: pooling kernel")->capture_default_str();
    app.add_option("--pooling", options.pooling, "snapkv/pyramidkv: avg or max")->capture_default_str();
    app.add_option("--policy-seed", options.seed, "random: seed")->capture_default_str();
    app.add_option("--stride", options.stride,
                   "sparse-strided: stride l; sparse-fixed: block length l (default: chosen from the budget)");
    app.add_option("--summary", options.summary, "sparse-fixed: summary positions c per block")->capture_default_str();
    app.add_option("--group-reduce", options.group_reduce, "GQA aggregation over a KV head's query heads: mean or max")
        ->capture_default_str();
  }
  std::unique_ptr<Policy> make() const { return make_policy(policy, options); }
  static std::string known_policies() {
    std::string s;
    for (const auto& n : policy_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }
};

}  // namespace kvevict
