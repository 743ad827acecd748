// eval, rouge, table and export: the commands built on tasks/ and the results CSV.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "harness/common/atomic_file.h"
#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/cli/commands.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/sweep/kvpress_leaderboard.h"
#include "harness/common/files.h"
#include "harness/common/output_paths.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/h2o_adaptor.h"
#include "harness/eval/result_rows.h"
#include "notebooks-export/notebook.h"
#include "notebooks-export/results_csv.h"
#include "notebooks-export/results_table.h"
#include "notebooks-export/svg_plot.h"
#include "tasks/rouge.h"

namespace kvevict {
namespace {

struct EvalArgs {
  std::string model, task, mode = "sim", protocol = "stream", score = "sum", format = "json", predictions;
  std::string pipeline = "lm-eval", question = "aware";
  bool greedy = false;
  int shots = 0, limit = -1, max_length = 1024, length = 0, max_new_tokens = 0;
  uint64_t fewshot_seed = 42;
  int batch_size = 0;  // 0: default_batch_size()
  double depth = 0;  // read only when --depth is given
  bool no_bos = false, bos = false, file_order = false, helm_truncate = false;
  bool no_context_reuse = false;
  int turns = 0;               // --turns: questions per context (SCBench's shared-context setting)
  std::string shared_context;  // --shared-context: multi-turn or multi-request
  double temperature = 0;
  uint64_t seed = 0;
  RuntimeFlags runtime;
  PolicyFlags policy;
};

struct RougeArgs {
  std::string jsonl, reference_field = "reference", prediction_field = "prediction";
};

struct TableArgs {
  std::string dir, rows = "task", cols = "policy", metric, out;
  std::vector<std::string> where;
};

struct ExportArgs {
  std::string dir, notebook, svg, format, out;
};

std::string results_csv_of(const std::string& dir) { return (std::filesystem::path(dir) / "results.csv").string(); }

// Progress on stderr: a live line on a terminal; otherwise (a log file) a plain line at
// most every 10 seconds and at the end, never a carriage return.
class EvalProgress {
 public:
  EvalProgress() : tty_(isatty(STDERR_FILENO)), last_(std::chrono::steady_clock::now()) {}
  void operator()(int done, int total) {
    if (tty_) {
      std::cerr << "\rexamples " << done << "/" << total << std::flush;
      live_ = true;
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (done == total || std::chrono::duration<double>(now - last_).count() > 10) {
      std::cerr << "examples " << done << "/" << total << std::endl;
      last_ = now;
    }
  }
  // Ends the live line (a terminal only).
  void finish() {
    if (live_) std::cerr << "\n";
  }

 private:
  bool tty_, live_ = false;
  std::chrono::steady_clock::time_point last_;
};

int run_eval(EvalArgs& a, const Invocation& at) {
  const std::string& data_override = at.data_override;
  // What cannot work is refused before the model loads and the examples run.
  if (a.model.empty()) a.model = data_path("models/stories260K-hf", data_override);
  if (!a.predictions.empty())
    check_output_file(a.predictions, "--predictions",
                      CommandInputs().folder(a.model, "--model").folder(data_dir(data_override), "the data folder"));
  if (a.greedy && make_task(a.task)->kind() != TaskKind::Generation)
    throw Error("--greedy: task " + a.task + " does not generate (it is scored, not decoded); --greedy is for xsum and cnndm");
  if (at.command.count("--max-length") && make_task(a.task)->long_context())
    check_max_length_holds_length(a.max_length, a.length, "--max-length", "--length");
  auto model = Model::load(a.model, a.runtime.options);
  use_threads_for(*model, a.runtime.options.threads);
  EvalConfig config;
  config.task = a.task;
  config.task_options.data_dir = data_dir(data_override);
  config.task_options.shots = a.shots;
  config.task_options.seed = a.fewshot_seed;
  config.task_options.limit = a.limit;
  config.task_options.lm_eval_shuffle = !a.file_order;
  config.task_options.xsum_helm_truncate = a.helm_truncate;
  config.policy = a.policy.policy;
  config.policy_options = a.policy.options;
  config.mode = parse_mode(a.mode);
  config.protocol = parse_protocol(a.protocol);
  config.score = parse_score_mode(a.score);
  config.task_options.pipeline = parse_pipeline(a.pipeline);
  // The H2O adaptor's log-likelihood is the mean over its scored positions.
  if (config.task_options.pipeline == Pipeline::H2O && at.command.count("--score") == 0) config.score = ScoreMode::Mean;
  config.greedy = a.greedy;
  if (a.bos) config.bos = true;
  if (a.no_bos) config.bos = false;
  config.max_length = a.max_length;
  config.max_new_tokens = a.max_new_tokens;
  config.temperature = a.temperature;
  config.sample_seed = a.seed;
  config.task_options.length = a.length;
  if (at.command.count("--depth")) config.task_options.depth = a.depth;
  config.question = parse_question_mode(a.question);
  config.task_options.turns = a.turns;
  if (!a.shared_context.empty()) config.shared_context = parse_shared_context(a.shared_context);
  config.batch_size = a.batch_size > 0 ? a.batch_size : default_batch_size(*model);
  config.context_reuse = !a.no_context_reuse;
  // Said once, where a default batches (a model that runs each op on one thread takes
  // whole requests on its threads instead, and prints nothing).
  if (a.batch_size == 0 && config.batch_size > 1)
    std::cerr << "batch size " << config.batch_size << " (this model's default on this machine; --batch-size N to choose)"
              << std::endl;
  // A long-context item is drawn from --seed (its answers are greedy: nothing is sampled).
  if (at.command.count("--seed") && make_task(a.task)->long_context())
    config.task_options.seed = a.seed;
  make_policy(config.policy, config.policy_options);  // unknown policy fails before any work
  EvalProgress progress;
  EvalResult result = evaluate(*model, config, [&progress](int done, int total) { progress(done, total); });
  progress.finish();
  if (!a.predictions.empty()) write_predictions(result, config, a.predictions);
  if (a.format == "json") {
    nlohmann::json j;
    j["model"] = a.model;
    j["task"] = a.task;
    j["policy"] = config.policy;
    j["mode"] = a.mode;
    j["protocol"] = a.protocol;
    j["score"] = score_mode_name(config.score);
    j["pipeline"] = a.pipeline;
    j["shots"] = a.shots;
    j["batch_size"] = config.batch_size;
    if (a.length > 0) {
      j["length"] = a.length;
      if (config.task_options.depth) j["depth"] = *config.task_options.depth;
      j["question"] = a.question;
      j["haystack"] = result.haystack;
      if (a.turns > 0) {
        j["turns"] = a.turns;
        j["shared_context"] = a.shared_context;
      }
    }
    j["n"] = result.n;
    for (const auto& m : result.metrics) {
      nlohmann::json& at_turn = m.turn ? j["metrics_per_turn"][std::to_string(*m.turn)] : j["metrics"];
      at_turn[m.name] = {{"value", m.value}, {"stderr", m.stderr_}};
    }
    if (result.agreement_with_full) j["agreement_with_full"] = *result.agreement_with_full;
    if (result.mean_abs_ll_change) j["mean_abs_ll_change"] = *result.mean_abs_ll_change;
    j["kv_tokens_kept"] = result.kv_tokens_kept;
    j["kv_bytes_peak"] = result.kv_bytes_peak;
    j["kv_bytes_full"] = result.kv_bytes_full;
    if (result.dmc_merge_rate) j["dmc_merge_rate"] = *result.dmc_merge_rate;
    if (result.prepass_token_ratio) j["prepass_token_ratio"] = *result.prepass_token_ratio;
    if (result.prepass_seconds) j["prepass_seconds"] = *result.prepass_seconds;
    j["kv_bits"] = config.policy_options.kv_quant.bits;
    j["seconds"] = result.seconds;
    std::cout << j.dump() << std::endl;
  } else if (a.format == "csv") {
    std::cout << result_header() << "\n";
    for (const auto& row : eval_rows(a.model, config, result)) std::cout << format_row(row) << "\n";
  } else {
    throw Error("unknown --format \"" + a.format + "\" (use json or csv)");
  }
  return 0;
}

int run_rouge(RougeArgs& rouge_args, const Invocation&) {
  std::ifstream in(rouge_args.jsonl);
  if (!in) throw Error(rouge_args.jsonl + ": cannot open file");
  std::string line;
  double r1 = 0, r2 = 0, rl = 0;
  int n = 0;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = parse_json(line, rouge_args.jsonl + ":" + std::to_string(line_no));
    } catch (const std::exception&) {
      throw Error(rouge_args.jsonl + ":" + std::to_string(line_no) + ": malformed JSON line");
    }
    for (const auto& field : {rouge_args.reference_field, rouge_args.prediction_field})
      if (!j.is_object() || !j.contains(field) || !j[field].is_string())
        throw Error(rouge_args.jsonl + ":" + std::to_string(line_no) + ": missing string field \"" + field + "\"");
    RougeScores s = rouge_scores(j[rouge_args.reference_field].get<std::string>(),
                                 j[rouge_args.prediction_field].get<std::string>());
    r1 += s.rouge1;
    r2 += s.rouge2;
    rl += s.rougeL;
    ++n;
  }
  if (n == 0) throw Error(rouge_args.jsonl + ": no records");
  nlohmann::json out = {{"n", n}, {"rouge1", 100 * r1 / n}, {"rouge2", 100 * r2 / n}, {"rougeL", 100 * rl / n}};
  std::cout << out.dump() << std::endl;
  return 0;
}

int run_table(TableArgs& table_args, const Invocation&) {
  const std::string out = table_args.out.empty() ? (std::filesystem::path(table_args.dir) / "table").string() : table_args.out;
  const CommandInputs inputs = CommandInputs().file(results_csv_of(table_args.dir), "the results");
  for (const char* extension : {".md", ".csv"}) check_output_file(out + extension, "--out", inputs);
  auto rows = read_results_for_export(results_csv_of(table_args.dir));
  if (!table_args.metric.empty()) {
    std::set<std::string> metrics;
    for (const auto& row : rows) metrics.insert(row.metric);
    if (!metrics.count(table_args.metric)) {
      std::string known;
      for (const auto& m : metrics) known += (known.empty() ? "" : ", ") + m;
      throw Error("--metric " + table_args.metric + ": " + results_csv_of(table_args.dir) +
                  " has no such metric (it has: " + (known.empty() ? "none" : known) + ")");
    }
  }
  PivotOptions options;
  options.row_key = table_args.rows;
  options.column_key = table_args.cols;
  options.filters = table_args.where;
  options.metric = table_args.metric;
  PivotTable table = pivot_results(rows, options);
  write_file_atomically(out + ".md", table.to_markdown());
  write_file_atomically(out + ".csv", table.to_csv());
  std::cout << table.to_markdown();
  std::cerr << "wrote " << out << ".md and " << out << ".csv\n";
  return 0;
}

int run_export(ExportArgs& export_args, const Invocation&) {
  if (export_args.notebook.empty() && export_args.svg.empty() && export_args.format.empty())
    throw Error("export needs --notebook FILE.ipynb, --svg OUTDIR and/or --format kvpress-leaderboard");
  if (!export_args.out.empty() && export_args.format.empty())
    throw Error("--out: names the leaderboard's folder, and needs --format kvpress-leaderboard");
  const CommandInputs inputs = CommandInputs().file(results_csv_of(export_args.dir), "the results");
  if (!export_args.notebook.empty()) check_output_file(export_args.notebook, "--notebook", inputs);
  if (!export_args.svg.empty()) check_output_folder(export_args.svg, "--svg", inputs);
  if (!export_args.format.empty()) {
    const std::string out = export_args.out.empty()
                                ? (std::filesystem::path(export_args.dir) / "kvpress-leaderboard").string()
                                : export_args.out;
    check_output_folder(out, "--out", inputs);
    std::vector<std::string> notes;
    const auto runs = leaderboard_runs(export_args.dir, &notes);
    for (const auto& note : notes) std::cerr << "note: " << note << "\n";
    if (runs.empty()) throw Error(export_args.dir + ": no RULER cell with predictions to export (see the notes)");
    for (const auto& run : runs) std::cerr << "wrote " << write_leaderboard_run(run, out) << "\n";
    if (export_args.notebook.empty() && export_args.svg.empty()) return 0;
  }
  auto rows = read_results_for_export(results_csv_of(export_args.dir));
  if (!export_args.notebook.empty()) {
    write_notebook(rows, export_args.notebook);
    std::cerr << "wrote " << export_args.notebook << "\n";
  }
  if (!export_args.svg.empty()) {
    for (const auto& path : write_svg_plots(rows, export_args.svg)) std::cerr << "wrote " << path << "\n";
  }
  return 0;
}

void add_eval_flags(CLI::App& cmd, EvalArgs& a) {
  CLI::App* eval_cmd = &cmd;
  eval_cmd->add_option("--model", a.model, "Hugging Face model directory (default: the bundled stories260K)");
  eval_cmd->add_option("--task", a.task,
                       "copa, piqa, winogrande, openbookqa, rte, mathqa, mathqa_cot, xsum, cnndm, perplexity, a long-context task "
                       "(ruler_niah_single_1, ..., ruler_vt, ruler_cwe, ruler_fwe, niah)")
      ->required();
  eval_cmd->add_option("--length", a.length, "long-context tasks: prompt plus answer length in the model's tokens")
      ->check(cli::at_least(1));
  eval_cmd->add_option("--depth", a.depth, "niah: the needle's depth in the context, in [0, 1]")
      ->check(cli::finite_range(0, 1));
  eval_cmd->add_option("--question", a.question,
                       "long-context tasks under prefill-compress: aware (compress context and question together) or "
                       "agnostic (compress the context, then feed the question uncompressed)")
      ->check(CLI::IsMember({"aware", "agnostic"}))
      ->capture_default_str();
  eval_cmd->add_option("--turns", a.turns,
                       "ruler_niah_* tasks: ask N questions of each context, one per needle key (SCBench's "
                       "shared-context setting); needs --shared-context")
      ->check(cli::at_least(1));
  eval_cmd->add_option("--shared-context", a.shared_context,
                       "with --turns: multi-turn (one cache: each question and answer enters the cache the earlier "
                       "turns left) or multi-request (each question against its own fork of the compressed context)")
      ->check(CLI::IsMember({"multi-turn", "multi-request"}));
  eval_cmd->add_option("--shots", a.shots, "few-shot examples")->check(cli::at_least(0))->capture_default_str();
  cli::add_seed_option(*eval_cmd, "--fewshot-seed", a.fewshot_seed, "few-shot sampling seed (lm-eval 0.3: 42)");
  eval_cmd->add_option("--limit", a.limit, "evaluate only the first N documents (-1: all)")->capture_default_str();
  eval_cmd->add_option("--mode", a.mode, "sim or decode")->capture_default_str();
  eval_cmd->add_option("--protocol", a.protocol, "stream or prefill-compress")->capture_default_str();
  eval_cmd->add_option("--score", a.score, "sum (lm-eval) or mean (the H2O pipeline)")->capture_default_str();
  eval_cmd->add_flag("--no-bos", a.no_bos, "no BOS token (the default for multiple choice, as the paper)");
  eval_cmd->add_flag("--bos", a.bos, "prepend BOS (the default for generation and perplexity)");
  eval_cmd->add_option("--batch-size", a.batch_size,
                       "sequences run together, each with its own cache and policy state (default: chosen from the "
                       "model and the machine); no number depends on it")
      ->check(cli::at_least(1));
  eval_cmd->add_flag("--no-context-reuse", a.no_context_reuse,
                     "decode mode, multiple choice: run each choice's whole request instead of continuing a fork "
                     "of the context the choices share (the numbers are the same either way)");
  eval_cmd->add_option("--max-length", a.max_length, "left-truncate requests to this many tokens")->check(cli::at_least(2))->capture_default_str();
  eval_cmd->add_option("--max-new-tokens", a.max_new_tokens,
                       "generation (XSum, CNN/DM): tokens to generate per document (0: the task's own, 64 and 128)")
      ->check(cli::at_least(0))
      ->capture_default_str();
  eval_cmd->add_option("--temperature", a.temperature, "generation (XSum, CNN/DM) sampling temperature (0: greedy)")->check(cli::finite_range(0, 1e6))->capture_default_str();
  cli::add_seed_option(*eval_cmd, "--seed", a.seed, "generation sampling seed; long-context tasks: the items' seed");
  eval_cmd->add_flag("--file-order", a.file_order, "keep the data file's order instead of lm-eval's seeded shuffle");
  eval_cmd->add_flag("--helm-truncate", a.helm_truncate, "XSum: cut articles to 512 words as HELM does");
  eval_cmd->add_option("--pipeline", a.pipeline,
                       "lm-eval (lm-eval 0.3 / HELM requests) or h2o (the H2O repository's adaptor: ftfy, joint "
                       "tokens, mean score, no BOS; XSum from its prompt file)")
      ->capture_default_str();
  eval_cmd->add_flag("--greedy", a.greedy, "generation under --pipeline h2o (XSum, CNN/DM): greedy decoding instead of the prompt file's temperature");
  eval_cmd->add_option("--format", a.format, "json or csv")->check(CLI::IsMember({"json", "csv"}))->capture_default_str();
  eval_cmd->add_option("--predictions", a.predictions, "write per-example predictions as JSONL");
  a.runtime.add_to(*eval_cmd);
  a.policy.add_to(*eval_cmd);
}

void add_rouge_flags(CLI::App& cmd, RougeArgs& rouge_args) {
  CLI::App* rouge_cmd = &cmd;
  rouge_cmd->add_option("--jsonl", rouge_args.jsonl, "one JSON object per line")->required();
  rouge_cmd->add_option("--reference-field", rouge_args.reference_field)->capture_default_str();
  rouge_cmd->add_option("--prediction-field", rouge_args.prediction_field)->capture_default_str();
}

void add_table_flags(CLI::App& cmd, TableArgs& table_args) {
  CLI::App* table_cmd = &cmd;
  table_cmd->add_option("dir", table_args.dir, "sweep output folder")->required();
  table_cmd->add_option("--rows", table_args.rows, "row key(s), comma-separated")->capture_default_str();
  table_cmd->add_option("--cols", table_args.cols, "column key(s), comma-separated")->capture_default_str();
  table_cmd->add_option("--where", table_args.where, "filters key=value (repeatable)");
  table_cmd->add_option("--metric", table_args.metric, "one metric (default: metric becomes part of the row key)");
  table_cmd->add_option("--out", table_args.out, "output path without extension (default: DIR/table)");
}

void add_export_flags(CLI::App& cmd, ExportArgs& export_args) {
  CLI::App* export_cmd = &cmd;
  export_cmd->add_option("dir", export_args.dir, "sweep output folder")->required();
  export_cmd->add_option("--notebook", export_args.notebook, "write an nbformat-4 notebook here");
  export_cmd->add_option("--svg", export_args.svg, "write standalone SVG plots into this folder");
  export_cmd->add_option("--format", export_args.format,
                         "kvpress-leaderboard: each RULER run (policy, budget, question mode, length) as a folder "
                         "with config.yaml, metrics.json and predictions.csv")
      ->check(CLI::IsMember({"kvpress-leaderboard"}));
  export_cmd->add_option("--out", export_args.out,
                         "with --format: the folder the runs' folders go into (default: DIR/kvpress-leaderboard)");
}

}  // namespace

void add_task_commands(CLI::App& app, Commands& commands) {
  add_command<EvalArgs>(commands, app, "eval",
                        "score a task under a policy (lm-eval multiple choice, XSum/CNN-DM generation, perplexity)",
                        add_eval_flags, run_eval);
  add_command<RougeArgs>(commands, app, "rouge",
                         "mean ROUGE-1/2/L F (x100) of a predictions JSONL, rouge_score semantics", add_rouge_flags,
                         run_rouge);
  add_command<TableArgs>(commands, app, "table", "pivot a results CSV into Markdown and CSV tables", add_table_flags,
                         run_table);
  add_command<ExportArgs>(commands, app, "export", "turn a results CSV into a Jupyter notebook and/or SVG plots",
                          add_export_flags, run_export);
}

}  // namespace kvevict
