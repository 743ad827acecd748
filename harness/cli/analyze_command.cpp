// analyze: its flags (body in harness/analysis/).
#include "harness/analysis/analyze.h"
#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/cli/commands.h"

namespace kvevict {
namespace {

void add_analyze_flags(CLI::App& cmd, AnalyzeArgs& a) {
  CLI::App* analyze_cmd = &cmd;
  analyze_cmd->add_option("--model", a.model, "Hugging Face model directory (default: the bundled stories260K)");
  auto* text = analyze_cmd->add_option("--text-file", a.text_file, "a text (BOS + its tokens)");
  auto* tokens = analyze_cmd->add_option("--tokens-file", a.tokens_file, "whitespace-separated token ids");
  auto* task = analyze_cmd->add_option("--task", a.task, "a task whose requests are analysed (copa, piqa, xsum, ...)");
  text->excludes(tokens)->excludes(task);
  tokens->excludes(task);
  analyze_cmd->add_option("--max-tokens", a.max_tokens, "text/tokens: cut to this many tokens")->capture_default_str();
  analyze_cmd->add_option("--limit", a.limit, "task: the first N documents (-1: all)")->capture_default_str();
  analyze_cmd->add_option("--shots", a.shots, "task: few-shot examples")->capture_default_str();
  analyze_cmd->add_option("--max-length", a.max_length, "task: left-truncate requests")->capture_default_str();
  analyze_cmd->add_flag("--bos", a.bos, "task: prepend BOS to multiple-choice contexts");
  std::string recall_defaults;
  for (const auto& name : default_recall_policies()) recall_defaults += (recall_defaults.empty() ? "" : ",") + name;
  analyze_cmd->add_option("--recall-policies", a.recall_policies,
                          "comma-separated policies for attention recall (default: " + recall_defaults +
                              "; \"none\" for no recall)");
  analyze_cmd->add_option("--recall-budgets", a.recall_budgets, "budgets (ratios) for attention recall")
      ->delimiter(',')
      ->capture_default_str();
  analyze_cmd->add_option("--deltas", a.deltas, "heavy-hitter persistence: step distances")->delimiter(',')->capture_default_str();
  analyze_cmd->add_option("--heavy-k-ratio", a.heavy_k_ratio, "heavy-hitter set size as a share of the sequence")
      ->capture_default_str();
  analyze_cmd->add_option("--block-rows", a.block_rows, "query rows per attention block (memory)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  add_policy_param_flags(*analyze_cmd, a.policy_options.params);  // for the recall policies
  analyze_cmd->add_option("--out", a.out, "write analysis.json, analysis.csv and plots/*.svg here");
  analyze_cmd->add_option("--config", a.config,
                          "run every entry of a config's \"analyze\" list (see configs/paper_observations.json) "
                          "into --out/<name>/");
  analyze_cmd->add_option("--format", a.format, "stdout: json or csv")->capture_default_str();
  add_runtime_flags(*analyze_cmd, a.runtime);
}

}  // namespace

void add_analyze_command(CLI::App& app, Commands& commands) {
  add_command<AnalyzeArgs>(
      commands, app, "analyze",
      "attention statistics: sparsity, power law, heavy-hitter persistence, attention recall per policy",
      add_analyze_flags, [](AnalyzeArgs& a, const Invocation& at) { return run_analyze(a, at.data_override); });
}

}  // namespace kvevict
