// analyze: its flags, the config's "analyze" entries, the token sequences to analyse, and
// what it writes and prints (the statistics are computed in harness/analysis/).
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "harness/analysis/analyze.h"
#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/cli/commands.h"
#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/output_paths.h"
#include "harness/config/analyze_entries.h"
#include "tasks/task.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

struct AnalyzeArgs {
  AnalyzeOptions options;
  std::string model, text_file, tokens_file, task, out, format = "json", config;
  std::string recall_policies;  // comma-separated; "none"; empty: the defaults
  int max_tokens = 512, limit = 20, shots = 0, max_length = 1024;
  uint64_t fewshot_seed = 42;
  bool bos = false;
  ModelOptions runtime;
};

void add_analyze_flags(CLI::App& cmd, AnalyzeArgs& a) {
  AnalyzeOptions& o = a.options;
  cmd.add_option("--model", a.model, "Hugging Face model directory (default: the bundled stories260K)");
  auto* text = cmd.add_option("--text-file", a.text_file, "a text (BOS + its tokens)");
  auto* tokens = cmd.add_option("--tokens-file", a.tokens_file, "whitespace-separated token ids");
  auto* task = cmd.add_option("--task", a.task, "a task whose requests are analysed (copa, piqa, xsum, ...)");
  text->excludes(tokens)->excludes(task);
  tokens->excludes(task);
  cmd.add_option("--max-tokens", a.max_tokens, "text/tokens: cut to this many tokens")
      ->check(cli::at_least(1))
      ->capture_default_str();
  cmd.add_option("--limit", a.limit, "task: the first N documents (-1: all)")->capture_default_str();
  cmd.add_option("--shots", a.shots, "task: few-shot examples")->capture_default_str();
  cmd.add_option("--max-length", a.max_length, "task: left-truncate requests")->capture_default_str();
  cmd.add_flag("--bos", a.bos, "task: prepend BOS to multiple-choice contexts");
  std::string recall_defaults;
  for (const auto& name : o.recall_policies) recall_defaults += (recall_defaults.empty() ? "" : ",") + name;
  cmd.add_option("--recall-policies", a.recall_policies,
                 "comma-separated policies for attention recall (default: " + recall_defaults +
                     "; \"none\" for no recall)");
  cmd.add_option("--recall-budgets", o.recall_budgets, "budgets (ratios) for attention recall")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--deltas", o.persistence_deltas, "heavy-hitter persistence: step distances")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--heavy-k-ratio", o.persistence_k_ratio, "heavy-hitter set size as a share of the sequence")
      ->capture_default_str();
  cmd.add_option("--block-rows", o.block_rows, "query rows per attention block (memory)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  add_policy_param_flags(cmd, o.policy_options.params);  // for the recall policies
  add_kv_quant_flags(cmd, o.policy_options.kv_quant);    // the model's own cache
  cmd.add_option("--out", a.out, "write analysis.json, analysis.csv and plots/*.svg here");
  cmd.add_option("--config", a.config,
                 "run every entry of a config's \"analyze\" list (see configs/paper_observations.json) "
                 "into --out/<name>/");
  cmd.add_option("--format", a.format, "stdout: json or csv")->capture_default_str();
  add_runtime_flags(cmd, a.runtime);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The token sequences to analyse: one per text/tokens file, one per task request.
std::vector<std::vector<int>> analyze_sequences(const Model& model, const AnalyzeArgs& a, const std::string& data) {
  std::vector<std::vector<int>> sequences;
  auto cut_front = [](std::vector<int>& ids, int keep) {
    if (keep > 0 && static_cast<int>(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
  };
  if (!a.text_file.empty() || !a.tokens_file.empty()) {
    std::vector<int> ids = a.tokens_file.empty() ? model.encode(read_text_file(a.text_file), true)
                                                 : read_tokens_file(a.tokens_file);
    if (ids.empty()) throw Error((a.tokens_file.empty() ? a.text_file : a.tokens_file) + ": no tokens to analyse");
    if (a.max_tokens > 0 && static_cast<int>(ids.size()) > a.max_tokens) ids.resize(a.max_tokens);
    sequences.push_back(ids);
    return sequences;
  }
  auto task = make_task(a.task);
  TaskOptions options;
  options.data_dir = data;
  options.shots = a.shots;
  options.seed = a.fewshot_seed;
  options.limit = a.limit;
  const int window = std::min<int>(a.max_length, static_cast<int>(model.arch().max_positions));
  if (task->kind() == TaskKind::MultipleChoice) {
    const Tokenizer& tokenizer = model.require_tokenizer();
    for (const auto& doc : task->multiple_choice_docs(options))
      for (const auto& request : doc.requests) {
        std::vector<int> ids = model.encode(request.context, a.bos);
        for (int id : tokenizer.encode(request.continuation)) ids.push_back(id);
        cut_front(ids, window);
        sequences.push_back(ids);
      }
  } else if (task->kind() == TaskKind::Generation) {
    for (const auto& doc : task->generation_docs(options)) {
      std::vector<int> ids = model.encode(doc.prompt, true);
      cut_front(ids, window);
      sequences.push_back(ids);
    }
  } else {
    std::vector<int> ids = model.encode(read_text_file(data + "/text/tinystories_sample.txt"), true);
    if (static_cast<int>(ids.size()) > window) ids.resize(window);
    sequences.push_back(ids);
  }
  if (sequences.empty()) throw Error("task " + a.task + " gave no requests to analyse");
  return sequences;
}

std::string analyze_model_dir(const AnalyzeArgs& a, const std::string& data_override) {
  return a.model.empty() ? data_path("models/stories260K-hf", data_override) : a.model;
}

// What one analysis reads, which its --out must not replace: analysis.json, analysis.csv
// and plots/ are written there.
void check_analyze_out(const AnalyzeArgs& a, const std::string& data_override) {
  CommandInputs inputs;
  inputs.folder(analyze_model_dir(a, data_override), "--model").file(a.text_file, "--text-file");
  inputs.file(a.tokens_file, "--tokens-file").file(a.config, "--config");
  if (!a.task.empty() || !a.config.empty()) inputs.folder(data_dir(data_override), "the data folder");
  check_output_folder(a.out, "--out", inputs, {"analysis.json", "analysis.csv", "plots"});
}

int analyze_once(const AnalyzeArgs& a, const std::string& data_override) {
  if (a.text_file.empty() && a.tokens_file.empty() && a.task.empty())
    throw Error("analyze needs --text-file, --tokens-file or --task");
  if (a.format != "json" && a.format != "csv") throw Error("unknown --format \"" + a.format + "\" (use json or csv)");
  const AnalyzeOptions& options = a.options;
  if (!(options.persistence_k_ratio > 0 && options.persistence_k_ratio <= 1))
    throw Error("--heavy-k-ratio must lie in (0, 1]");
  for (int d : options.persistence_deltas)
    if (d < 1) throw Error("--deltas: " + std::to_string(d) + " is not a positive step distance");
  for (double b : options.recall_budgets)
    if (!(b > 0 && b <= 1)) throw Error("--recall-budgets: " + std::to_string(b) + " is outside (0, 1]");
  if (!a.text_file.empty() + !a.tokens_file.empty() + !a.task.empty() > 1)
    throw Error("analyze takes one of --text-file, --tokens-file or --task");
  if (!a.out.empty()) check_analyze_out(a, data_override);
  for (const auto& name : options.recall_policies) make_policy(name, options.policy_options);  // unknown names fail here
  const std::string model_dir = analyze_model_dir(a, data_override);
  const KvQuantSpec& kv_quant = options.policy_options.kv_quant;
  check_kv_quant_spec(kv_quant);
  auto model = Model::load(model_dir, a.runtime);
  use_threads_for(*model, a.runtime.threads);
  if (kv_quant.enabled()) {
    check_kv_quant_head_dim(kv_quant, model->arch().head_dim);
    if (model->arch().dmc.enabled()) throw Error("analyze: --kv-quant cannot quantize a DMC model's merged slots");
  }
  const auto sequences = analyze_sequences(*model, a, data_dir(data_override));
  const AttentionAnalysis analysis = analyze_attention(*model, sequences, options);
  nlohmann::json j = analysis.to_json(options);
  j["model"] = model_dir;
  j["source"] = !a.text_file.empty() ? a.text_file : !a.tokens_file.empty() ? a.tokens_file : "task:" + a.task;
  j["kv_quant"] = kv_quant_method(kv_quant);
  if (kv_quant.enabled()) {
    j["kv_bits"] = kv_quant.bits;
    j["kv_group"] = kv_quant.group;
    j["kv_residual"] = kv_quant.residual;
  }
  if (!a.out.empty()) {
    fs::create_directories(a.out);
    write_file_atomically((fs::path(a.out) / "analysis.json").string(), j.dump(2) + "\n");
    write_file_atomically((fs::path(a.out) / "analysis.csv").string(), analysis.to_csv(options));
    for (const auto& path : analysis.write_plots(options, (fs::path(a.out) / "plots").string()))
      std::cerr << "wrote " << path << "\n";
  }
  if (a.format == "json")
    std::cout << j.dump() << std::endl;
  else
    std::cout << analysis.to_csv(options);
  return 0;
}

// Each entry of the config's "analyze" list (harness/config/analyze_entries.h) runs into
// --out/<name>/, all of them read and checked before the first one runs.
int analyze_config(const AnalyzeArgs& base, const std::string& data_override) {
  if (base.out.empty()) throw Error("analyze --config needs --out DIR");
  check_analyze_out(base, data_override);
  AnalyzeEntry defaults;
  defaults.limit = base.limit;
  defaults.shots = base.shots;
  defaults.max_tokens = base.max_tokens;
  defaults.recall_policies = base.options.recall_policies;
  defaults.recall_budgets = base.options.recall_budgets;
  defaults.deltas = base.options.persistence_deltas;
  std::vector<AnalyzeArgs> runs;
  for (const AnalyzeEntry& e : read_analyze_entries(read_json_file(base.config), base.config, base.out, defaults,
                                                    base.options.policy_options, data_override)) {
    AnalyzeArgs a = base;
    a.out = e.out;
    a.text_file = e.text_file;
    a.tokens_file.clear();
    a.task = e.task;
    a.limit = e.limit;
    a.shots = e.shots;
    a.max_tokens = e.max_tokens;
    a.options.recall_policies = e.recall_policies;
    a.options.recall_budgets = e.recall_budgets;
    a.options.persistence_deltas = e.deltas;
    runs.push_back(a);
  }
  for (const auto& a : runs) check_analyze_out(a, data_override);  // every entry's, before the first runs
  for (const auto& a : runs) {
    std::cerr << "analyze " << a.out << std::endl;
    analyze_once(a, data_override);
  }
  return 0;
}

int run_analyze_command(AnalyzeArgs& args, const Invocation& at) {
  if (!args.recall_policies.empty())
    args.options.recall_policies =
        args.recall_policies == "none" ? std::vector<std::string>{} : split_list(args.recall_policies);
  if (!args.config.empty()) return analyze_config(args, at.data_override);
  return analyze_once(args, at.data_override);
}

}  // namespace

void add_analyze_command(CLI::App& app, Commands& commands) {
  add_command<AnalyzeArgs>(
      commands, app, "analyze",
      "attention statistics: sparsity, power law, heavy-hitter persistence, attention recall per policy",
      add_analyze_flags, run_analyze_command);
}

}  // namespace kvevict
