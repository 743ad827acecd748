// The policy and budget flags every subcommand shares, so they read the same
// everywhere: --policy --budget --budget-tokens --heavy-share --heavy-ratio
// --recent-ratio, and one flag per declared policy parameter (policies/params.h).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "harness/common/errors.h"
#include "harness/cli/cli_checks.h"
#include "policies/registry.h"

namespace kvevict {

// The cache's quantization (harness/common/kv_quant.h). CLI11 runs the callbacks in this
// order, so --kv-quant kivi sees --kv-bits (2 when not given).
inline void add_kv_quant_flags(CLI::App& app, KvQuantSpec& spec) {
  // Each setting records that it was given, so check_kv_quant_spec can refuse a
  // contradiction (kv_quant.h) instead of letting one side of it win.
  auto setting = [&app](const std::string& flag, int& value, bool& given, const std::string& help) {
    return app.add_option_function<int>(
        flag,
        [&value, &given](int v) {
          value = v;
          given = true;
        },
        help);
  };
  setting("--kv-bits", spec.bits, spec.bits_given, "bits per cached key/value element with --kv-quant kivi: 2 or 4")
      ->default_str("2");
  setting("--kv-group", spec.group, spec.group_given,
          "KIVI group size G (keys: G tokens of a channel; values: G channels)")
      ->default_str(std::to_string(spec.group));
  setting("--kv-residual", spec.residual, spec.residual_given, "KIVI full-precision residual R, a multiple of G")
      ->default_str(std::to_string(spec.residual));
  app.add_option_function<std::string>(
      "--kv-quant",
      [&spec](const std::string& method) {
        try {
          set_kv_quant_method(spec, method);
        } catch (const Error& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      "KV-cache quantization: none or kivi");
}

// One flag per parameter any policy declares (--n-sink, --window, --kernel, --pooling,
// --policy-seed, --stride, --summary, --group-reduce, --pyramid-beta, ...), checked
// against its declaration as it is parsed.
inline void add_policy_param_flags(CLI::App& app, PolicyParams& params) {
  for (const ParamSpec* spec : all_policy_params()) {
    app.add_option_function<std::string>(
           spec->cli_flag(),
           [spec, &params](const std::string& value) {
             try {
               params.set(*spec, value, spec->cli_flag());
             } catch (const Error& e) {
               throw CLI::ValidationError(e.what());
             }
           },
           spec->describe())
        ->default_str(spec->default_text())
        ->type_name(spec->kind() == ParamSpec::Kind::Real ? "FLOAT"
                    : spec->kind() == ParamSpec::Kind::Choice || spec->kind() == ParamSpec::Kind::Text ? "TEXT"
                                                               : "INT");
  }
}

struct PolicyFlags {
  std::string policy = reference_policy_name();
  PolicyOptions options;
  void add_to(CLI::App& app) {
    app.add_option("--policy", policy, "eviction policy: " + policy_help())->capture_default_str();
    app.add_option("--budget", options.budget.ratio, "cache budget as a ratio of the sequence length, in (0, 1]")
        ->check(cli::finite_range(0, 1, true));
    app.add_option("--budget-tokens", options.budget.tokens, "cache budget as an absolute token count")->check(cli::at_least(1));
    app.add_option("--heavy-share", options.budget.heavy_share,
                   "share of the budget given to heavy hitters (default: the policy's)");
    app.add_option("--heavy-ratio", options.budget.heavy_ratio, "the paper's heavy-hitter ratio of the length");
    app.add_option("--recent-ratio", options.budget.recent_ratio, "the paper's recent-window ratio of the length");
    add_policy_param_flags(app, options.params);
    add_kv_quant_flags(app, options.kv_quant);
    app.add_option("--kv-memory", options.kv_quant.memory,
                   "cache budget in bytes as a fraction of the fp16 cache, in (0, 1]: picks the token budget");
  }
  std::unique_ptr<Policy> make() const { return make_policy(policy, options); }
};

}  // namespace kvevict
