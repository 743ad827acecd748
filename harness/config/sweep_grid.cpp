#include "harness/config/sweep_grid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "harness/common/config_reader.h"
#include "harness/common/dtype_names.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/limits.h"
#include "harness/config/policy_options_json.h"
#include "policies/registry.h"

namespace kvevict {
std::pair<int, int> parse_shard(const std::string& text) {
  int i = -1, n = -1;
  char slash = 0;
  std::istringstream in(text);
  if (!(in >> i >> slash >> n) || slash != '/' || n < 1 || i < 0 || i >= n || !in.eof())
    throw Error("--shard \"" + text + "\" must be i/N with 0 <= i < N");
  return {i, n};
}

namespace {

// Identity columns: a cell is finished when results.csv holds rows with its key.
const std::vector<std::string> kIdentityColumns = result_columns(ColumnRole::setting);

template <typename T>
std::vector<T> axis(const nlohmann::json& config, const std::string& path, const std::string& key,
                    std::vector<T> fallback) {
  if (!config.contains(key)) return fallback;
  const auto& v = config[key];
  try {
    if (v.is_array()) {
      auto out = v.get<std::vector<T>>();
      if (out.empty()) throw Error("empty list");
      return out;
    }
    return {v.get<T>()};
  } catch (const std::exception& e) {
    throw Error(path + ": key \"" + key + "\" has the wrong type (" + json_error_message(e) + ")");
  }
}

int checked_int(const nlohmann::json& v, const std::string& path, const std::string& key, long long low,
                long long high) {
  return static_cast<int>(json_int(v, path, key, low, high));
}

std::vector<int> int_axis(const nlohmann::json& config, const std::string& path, const std::string& key,
                          std::vector<int> fallback, long long low) {
  if (!config.contains(key)) return fallback;
  const auto& v = config[key];
  if (v.is_array() && v.empty()) throw Error(path + ": key \"" + key + "\" is an empty list");
  std::vector<int> out;
  for (const auto& item : v.is_array() ? v : nlohmann::json::array({v}))
    out.push_back(checked_int(item, path, key, low, std::numeric_limits<int>::max()));
  return out;
}

}  // namespace

std::string row_cell_key(const ResultRow& row) {
  auto fields = row.fields();
  std::string key;
  for (const auto& c : kIdentityColumns) key += fields[c] + "|";
  return key;
}

std::string SweepCell::key() const { return row_cell_key(identity_row(model, eval)); }

const std::vector<std::string>& sweep_config_keys() {
  static const std::vector<std::string> keys = {
      "name", "description", "models", "tasks", "policies", "budgets", "budget_tokens", "heavy_shares", "protocols",
      "shots", "seeds", "limit", "mode", "score", "max_length", "max_new_tokens", "bos", "policy_options", "predictions", "note",
      "temperature", "file_order", "slurm", "device", "dtype", "pipelines", "pipeline", "greedy",
      "lengths", "depths", "questions",
      "turns", "shared_contexts",  // SCBench's shared-context evaluation of the ruler_niah_* tasks
      "analyze",  // "analyze": run by `kvevict analyze --config`
      "kv_quant", "kv_bits", "kv_group", "kv_residual", "kv_memories",
      "batch_size",      // how many sequences run together: not part of a cell's identity
      "context_reuse"};  // whether choices share their context's model calls: likewise
  return keys;
}

std::string cell_label(const SweepCell& cell) {
  const auto fields = identity_row(cell.model, cell.eval).fields();
  std::string label;
  for (const auto& column : label_columns())
    if (!fields.at(column).empty()) label += (label.empty() ? "" : " ") + column + "=" + fields.at(column);
  return label;
}

std::map<std::string, std::string> cell_identity(const SweepCell& cell) {
  return identity_row(cell.model, cell.eval).fields();
}

namespace {
SweepPlan expand_sweep_grid(const nlohmann::json& config, const std::string& path, const std::string& data_dir);
}  // namespace

SweepPlan expand_sweep(const nlohmann::json& config, const std::string& path, const std::string& data_dir) {
  SweepPlan plan;
  try {
    plan = expand_sweep_grid(config, path, data_dir);
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong type deep in the config: name the file, not only the JSON library.
    throw Error(path + ": a key has the wrong type (" + json_error_message(e) + ")");
  }
  // A grid listing a value twice (budgets [0.2, 0.2]) would run and write the cell twice.
  std::set<std::string> seen;
  std::vector<SweepCell> unique;
  for (auto& cell : plan.cells) {
    if (seen.insert(cell.key()).second) {
      unique.push_back(std::move(cell));
    } else {
      plan.skipped.push_back("duplicate cell " + cell_label(cell) + ": listed twice in the config, run once");
    }
  }
  plan.cells = std::move(unique);
  return plan;
}

namespace {
SweepPlan expand_sweep_grid(const nlohmann::json& config, const std::string& path, const std::string& data_dir) {
  if (!config.is_object()) throw Error(path + ": a sweep config must be a JSON object");
  const ConfigObject keys(config, path, sweep_config_keys());
  for (const char* key : {"predictions", "greedy", "bos"}) keys.flag(key, false);
  const bool context_reuse = keys.flag("context_reuse", true);
  SweepPlan plan;
  plan.config = config;
  plan.config.erase("slurm");  // how to run, not what: not part of the sweep's identity
  plan.config.erase("batch_size");     // likewise: every number is the same at any batch size
  plan.config.erase("context_reuse");  // and with or without shared-context reuse
  // The model options every cell uses fail here, before a cell runs or a job is submitted.
  plan.device = keys.text("device", plan.device);
  plan.dtype = keys.text("dtype", plan.dtype);
  try {
    parse_dtype_name(plan.dtype);
  } catch (const Error& e) {
    throw Error(keys.name("dtype") + ": " + e.what());
  }
  auto models = axis<std::string>(config, path, "models", {"models/stories260K-hf"});
  auto tasks = axis<std::string>(config, path, "tasks", {});
  if (tasks.empty()) throw Error(path + ": \"tasks\" is required");
  for (const auto& t : tasks) make_task(t);  // unknown task fails here, naming the known ones
  auto policies = axis<std::string>(config, path, "policies", {reference_policy_name()});
  auto budgets = axis<double>(config, path, "budgets", {});
  auto budget_tokens = int_axis(config, path, "budget_tokens", {}, std::numeric_limits<int>::min());
  auto shares = axis<double>(config, path, "heavy_shares", {-1.0});
  auto protocols = axis<std::string>(config, path, "protocols", {"stream"});
  auto shots = int_axis(config, path, "shots", {0}, 0);
  std::vector<uint64_t> seeds = {42};
  if (config.contains("seeds")) {
    const auto& v = config["seeds"];
    if (v.is_array() && v.empty()) throw Error(path + ": key \"seeds\" is an empty list");
    seeds.clear();
    for (const auto& item : v.is_array() ? v : nlohmann::json::array({v})) seeds.push_back(json_seed(item, path, "seeds"));
  }
  // "pipelines": ["lm-eval", "h2o"] (or "pipeline": "h2o"); part of each cell's identity.
  if (config.contains("pipelines") && config.contains("pipeline"))
    throw Error(path + ": give \"pipelines\" or \"pipeline\", not both");
  std::vector<Pipeline> pipelines;
  for (const auto& name : axis<std::string>(config, path, config.contains("pipeline") ? "pipeline" : "pipelines", {"lm-eval"})) {
    try {
      pipelines.push_back(parse_pipeline(name));
    } catch (const Error& e) {
      throw Error(path + ": key \"pipelines\": " + e.what());
    }
  }
  // The long-context tasks' axes: prompt lengths, niah's needle depths, question modes.
  const auto lengths = int_axis(config, path, "lengths", {}, 1);
  const auto depths = axis<double>(config, path, "depths", {});
  for (double d : depths)
    if (!(d >= 0 && d <= 1)) throw Error(path + ": key \"depths\": " + std::to_string(d) + " is not in [0, 1]");
  std::vector<QuestionMode> questions;
  for (const auto& name : axis<std::string>(config, path, "questions", {"aware"})) {
    try {
      questions.push_back(parse_question_mode(name));
    } catch (const Error& e) {
      throw Error(path + ": key \"questions\": " + e.what());
    }
  }
  // SCBench's shared-context evaluation: questions per context, and the protocols.
  const int turns = config.contains("turns") ? checked_int(config["turns"], path, "turns", 1, 1000000) : 0;
  std::vector<SharedContext> shared_contexts;
  for (const auto& name : axis<std::string>(config, path, "shared_contexts", {})) {
    try {
      shared_contexts.push_back(parse_shared_context(name));
    } catch (const Error& e) {
      throw Error(path + ": key \"shared_contexts\": " + e.what());
    }
  }
  if ((turns > 0) != !shared_contexts.empty())
    throw Error(path + ": keys \"turns\" and \"shared_contexts\" go together: the questions asked of each "
                "context and the protocols (multi-turn, multi-request) that ask them");
  if (turns > 0 && (std::count(questions.begin(), questions.end(), QuestionMode::Aware) > 0 ||
                    std::any_of(protocols.begin(), protocols.end(), [](const std::string& protocol) {
                      return parse_protocol(protocol) != Protocol::PrefillCompress;
                    })))
    throw Error(path + ": key \"shared_contexts\" compresses the context once, before any question is seen: it needs "
                "\"questions\": [\"agnostic\"] and \"protocols\": [\"prefill-compress\"]");
  // A long-context key that no cell would read is refused, not dropped: the grid would run
  // as if it were not there.
  {
    std::string long_context_tasks, depth_tasks;
    for (const auto& task : tasks) {
      const auto made = make_task(task);
      if (made->long_context()) long_context_tasks += (long_context_tasks.empty() ? "" : ", ") + task;
      if (made->needle_depth()) depth_tasks += (depth_tasks.empty() ? "" : ", ") + task;
    }
    std::string listed;
    for (const auto& task : tasks) listed += (listed.empty() ? "" : ", ") + task;
    if (long_context_tasks.empty())
      for (const char* key : {"lengths", "depths", "questions", "turns", "shared_contexts"})
        if (config.contains(key))
          throw Error(path + ": key \"" + key + "\" applies to the long-context tasks (ruler_*, niah); \"tasks\" lists " +
                      listed);
    if (!depths.empty() && depth_tasks.empty())
      throw Error(path + ": key \"depths\" applies to niah, whose needle depth is asked for; " + long_context_tasks +
                  " draw their depths");
    const bool agnostic = std::count(questions.begin(), questions.end(), QuestionMode::Agnostic) > 0;
    const bool prefill_compress = std::any_of(protocols.begin(), protocols.end(), [](const std::string& protocol) {
      return parse_protocol(protocol) == Protocol::PrefillCompress;
    });
    if (agnostic && !prefill_compress)
      throw Error(path + ": key \"questions\": agnostic compresses the context before the question is seen, which "
                  "needs \"protocols\" to list prefill-compress (tasks " + long_context_tasks + ")");
    if (config.contains("max_length") && !long_context_tasks.empty())
      for (int length : lengths)
        check_max_length_holds_length(
            checked_int(config["max_length"], path, "max_length", 2, std::numeric_limits<int>::max()), length,
            path + ": key \"max_length\"", "\"lengths\" value");
  }
  struct LongContextChoice {
    int length = 0;
    std::optional<double> depth;
    QuestionMode question = QuestionMode::Aware;
    SharedContext shared = SharedContext::None;
  };
  auto long_context_choices = [&](const std::string& task) {
    const auto made = make_task(task);
    if (!made->long_context()) return std::vector<LongContextChoice>{{}};
    if (lengths.empty()) throw Error(path + ": task " + task + " needs \"lengths\" (prompt lengths in tokens)");
    if (made->needle_depth() && depths.empty()) throw Error(path + ": task " + task + " needs \"depths\" in [0, 1]");
    std::vector<LongContextChoice> choices;
    for (int length : lengths)
      for (size_t d = 0; d < (made->needle_depth() ? depths.size() : 1); ++d)
        for (QuestionMode question : questions)
          for (size_t s = 0; s < std::max<size_t>(shared_contexts.size(), 1); ++s) {
            LongContextChoice c{length, std::nullopt, question};
            if (made->needle_depth()) c.depth = depths[d];
            if (!shared_contexts.empty()) c.shared = shared_contexts[s];
            choices.push_back(c);
          }
    return choices;
  };
  // Cells the H2O pipeline cannot run are refused here, naming the key, rather than each
  // failing at run time (the evaluator and the tasks check the same rules).
  if (std::count(pipelines.begin(), pipelines.end(), Pipeline::H2O))
    for (const auto& task : tasks) {
      const TaskKind kind = make_task(task)->kind();
      const std::string cells = " (\"pipelines\" lists h2o): run it under lm-eval, in another config if the grid needs both";
      if (kind == TaskKind::Perplexity)
        throw Error(path + ": key \"tasks\": the H2O pipeline has no " + task + " task" + cells);
      if (kind == TaskKind::Generation)
        for (int shot : shots)
          if (shot != 0)
            throw Error(path + ": key \"shots\": " + std::to_string(shot) + "-shot " + task +
                        " cannot run under the H2O pipeline, which reads H2O's 0-shot prompt file as it is" + cells);
      if (kind == TaskKind::MultipleChoice)
        for (const auto& protocol : protocols)
          if (protocol != "stream")
            throw Error(path + ": key \"protocols\": " + task + " under the H2O pipeline is scored with the stream protocol, not " +
                        protocol + cells);
    }
  if (std::count(pipelines.begin(), pipelines.end(), Pipeline::H2O) && config.contains("bos") && config["bos"] == true)
    throw Error(path + ": key \"bos\": the H2O pipeline runs without BOS (\"pipelines\" lists h2o)");
  // "limit": N for every task, or {"xsum": 5, "*": 100} per task.
  auto limit_for = [&](const std::string& task) {
    if (!config.contains("limit")) return -1;
    const auto& l = config["limit"];
    int limit = -2;
    const int most = std::numeric_limits<int>::max();
    if (l.is_number()) limit = checked_int(l, path, "limit", -1, most);
    else if (l.is_object() && l.contains(task)) limit = checked_int(l[task], path, "limit." + task, -1, most);
    else if (l.is_object()) limit = l.contains("*") ? checked_int(l["*"], path, "limit.*", -1, most) : -1;
    else throw Error(path + ": \"limit\" must be an integer or an object of task -> integer");
    // 0 documents would be an accuracy over n = 0; -1 means all.
    if (limit == 0 || limit < -1)
      throw Error(path + ": key \"limit\": " + std::to_string(limit) + " for task " + task +
                  " must be a positive number of documents (or -1 for all)");
    return limit;
  };
  // The budget rules of policies/budget.h, naming this file's keys.
  auto check_budget = [&](BudgetSpec spec) {
    spec.keys = &kSweepBudgetKeys;
    try {
      check_budget_spec(spec);
    } catch (const Error& e) {
      throw Error(path + ": " + e.what());
    }
  };
  for (double b : budgets) check_budget(BudgetSpec{b});
  for (int t : budget_tokens) check_budget(BudgetSpec{-1, t});
  for (double s : shares)
    if (s != -1.0) check_budget(BudgetSpec{-1, -1, s});

  PolicyOptions base_options;
  if (config.contains("policy_options")) base_options.params = read_policy_options(config["policy_options"], path);
  // The cache's quantization: "kv_quant" ("none" or "kivi"), "kv_bits" (an axis; 16 is
  // unquantized), "kv_group", "kv_residual"; "kv_memories" (an axis of byte budgets, each
  // a budget choice of its own).
  KvQuantSpec quant_base;
  quant_base.keys = &kSweepKvQuantKeys;
  quant_base.group = checked_int(config.value("kv_group", nlohmann::json(quant_base.group)), path, "kv_group", 1, 1 << 20);
  quant_base.residual =
      checked_int(config.value("kv_residual", nlohmann::json(quant_base.residual)), path, "kv_residual", 1, 1 << 30);
  const std::string quant_method = keys.text("kv_quant", "none");
  auto kv_bits = int_axis(config, path, "kv_bits", {quant_method == "none" ? 16 : 2}, 2);
  auto memories = axis<double>(config, path, "kv_memories", {});
  std::vector<KvQuantSpec> quant_choices;
  for (int bits : kv_bits) {
    KvQuantSpec q = quant_base;
    q.bits = bits;
    try {
      set_kv_quant_method(q, quant_method);  // checks the name
      q.bits = bits;                          // 16: this cell is unquantized
      if (quant_method == "none" && config.contains("kv_quant") && bits != 16)
        throw Error(std::string("kv_bits ") + std::to_string(bits) + " needs \"kv_quant\": \"kivi\"");
      check_kv_quant_spec(q);
      for (double m : memories) {
        KvQuantSpec with_memory = q;
        with_memory.memory = m;
        check_kv_quant_spec(with_memory);
      }
    } catch (const Error& e) {
      throw Error(path + ": " + e.what());
    }
    quant_choices.push_back(q);
  }
  struct BudgetChoice {
    double ratio = -1;
    int tokens = -1;
    double memory = -1;
  };
  // A byte budget is a budget choice of its own, for policies that evict from a cache:
  // beside ratio or token budgets its cells would mix two kinds of budget on one axis, and
  // a grid where no policy can use it would run with the key ignored.
  if (!memories.empty()) {
    if (!budgets.empty() || !budget_tokens.empty())
      throw Error(path + ": key \"kv_memories\" picks each cell's token budget from its bytes; give it or \"" +
                  std::string(budgets.empty() ? "budget_tokens" : "budgets") + "\", not both");
    bool some_policy_evicts = false;
    for (const auto& policy : policies) {
      const auto made = make_policy(policy, base_options);
      if (!made->realisable())
        throw Error(path + ": key \"kv_memories\": policy " + policy +
                    " is sim-only and holds no cache whose bytes it could count (run it with \"budgets\" in another config)");
      some_policy_evicts = some_policy_evicts || !made->keeps_everything();
    }
    if (!some_policy_evicts)
      throw Error(path + ": key \"kv_memories\": no policy in \"policies\" evicts (each keeps every token)");
  }
  std::vector<BudgetChoice> budget_choices;
  for (double b : budgets) budget_choices.push_back({b, -1});
  for (int t : budget_tokens) budget_choices.push_back({-1, t});
  for (double m : memories) budget_choices.push_back({-1, -1, m});

  for (const auto& model : models)
    for (const auto& task : tasks)
     for (Pipeline pipeline : pipelines)
      for (const auto& protocol : protocols)
        for (int shot : shots)
          for (uint64_t seed : seeds)
            for (const auto& policy : policies)
             for (const KvQuantSpec& quant : quant_choices) {
              const auto made = make_policy(policy, base_options);  // unknown policy fails here
              std::vector<std::pair<BudgetChoice, double>> variants;
              if (made->keeps_everything()) {
                variants.push_back({{}, -1});
              } else {
                if (budget_choices.empty())
                  throw Error(path + ": policy " + policy + " needs \"budgets\", \"budget_tokens\" or \"kv_memories\"");
                for (const auto& b : budget_choices) {
                  if (made->splits_budget())
                    for (double s : shares) variants.push_back({b, s});
                  else
                    variants.push_back({b, -1});
                }
              }
              // A sim-only policy cannot generate: no generation-task cell for it.
              if (!made->realisable() &&
                  make_task(task)->kind() == TaskKind::Generation) {
                plan.skipped.push_back(policy + " x " + task + ": a sim-only policy cannot generate");
                continue;
              }
              if (!made->realisable() && quant.enabled()) {
                plan.skipped.push_back(policy + " x kv_bits " + std::to_string(quant.bits) +
                                       ": a sim-only policy has no cache to quantize");
                continue;
              }
              for (const LongContextChoice& lc : long_context_choices(task))
              for (const auto& [b, share] : variants) {
                if (lc.question == QuestionMode::Agnostic && parse_protocol(protocol) != Protocol::PrefillCompress) {
                  plan.skipped.push_back(policy + " x " + task + " x " + protocol +
                                         ": the question-agnostic protocol needs prefill-compress");
                  break;
                }
                SweepCell cell;
                cell.model = model;
                EvalConfig& e = cell.eval;
                e.task = task;
                e.task_options.data_dir = data_dir;
                e.task_options.shots = shot;
                e.task_options.seed = seed;
                e.task_options.limit = limit_for(task);
                e.task_options.lm_eval_shuffle = !config.value("file_order", false);
                e.task_options.pipeline = pipeline;
                e.task_options.length = lc.length;
                e.task_options.depth = lc.depth;
                e.question = lc.question;
                if (lc.shared != SharedContext::None) {
                  e.task_options.turns = turns;
                  e.shared_context = lc.shared;
                }
                e.policy = policy;
                e.policy_options = base_options;
                set_run_seed(e.policy_options.params, made->parameters(), seed);
                e.policy_options.budget.keys = &kSweepBudgetKeys;
                e.policy_options.budget.ratio = b.ratio;
                e.policy_options.budget.tokens = b.tokens;
                e.policy_options.budget.heavy_share = share;
                e.policy_options.kv_quant = quant;
                e.policy_options.kv_quant.memory = b.memory;
                e.mode = parse_mode(config.value("mode", std::string("sim")));
                e.protocol = parse_protocol(protocol);
                // The H2O adaptor's log-likelihood is a mean unless the config says otherwise.
                e.score = parse_score_mode(config.value(
                    "score", std::string(pipeline == Pipeline::H2O ? "mean" : "sum")));
                e.max_length = config.contains("max_length")
                                   ? checked_int(config["max_length"], path, "max_length", 2, std::numeric_limits<int>::max())
                                   : 1024;
                if (config.contains("max_new_tokens"))
                  e.max_new_tokens = checked_int(config["max_new_tokens"], path, "max_new_tokens", 1, kMaxModelPositions);
                e.temperature = config.value("temperature", 0.0);
                if (!(e.temperature >= 0 && std::isfinite(e.temperature)))
                  throw Error(path + ": key \"temperature\" must be a finite number >= 0");
                e.greedy = config.value("greedy", false);  // XSum under pipeline h2o
                e.sample_seed = seed;
                if (config.contains("bos")) e.bos = config["bos"].get<bool>();
                if (config.contains("batch_size"))
                  e.batch_size = checked_int(config["batch_size"], path, "batch_size", 1, 4096);
                e.context_reuse = context_reuse;
                plan.cells.push_back(cell);
              }
            }
  return plan;
}
}  // namespace

}  // namespace kvevict
