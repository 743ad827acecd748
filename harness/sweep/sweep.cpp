#include "harness/sweep/sweep.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <type_traits>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "harness/common/atomic_file.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/eval/h2o_adaptor.h"
#include "harness/eval/result_rows.h"
#include "harness/common/folder_lock.h"
#include "policies/option_checks.h"
#include "policies/registry.h"

namespace kvevict {
namespace fs = std::filesystem;

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

// "policy_options": a closed set of keys, each of its type; the ranges are the policy's own checks.
PolicyOptions read_policy_options(const nlohmann::json& config, const std::string& path) {
  PolicyOptions options;
  if (!config.contains("policy_options")) return options;
  const auto& po = config["policy_options"];
  if (!po.is_object()) throw Error(path + ": \"policy_options\" must be an object");
  auto read = [&](const std::string& key, auto& field) {
    using Field = std::decay_t<decltype(field)>;
    const auto& value = po[key];
    const bool fits = std::is_same_v<Field, std::string> ? value.is_string() : value.is_number_integer();
    if (!fits)
      throw Error(path + ": key \"policy_options." + key + "\" must be " +
                  (std::is_same_v<Field, std::string> ? "a string" : "an integer") + ", not " + value.dump());
    if constexpr (std::is_same_v<Field, std::string>) {
      field = value.template get<std::string>();
    } else {
      const int64_t wide = value.template get<int64_t>();
      if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
        throw Error(path + ": key \"policy_options." + key + "\" is out of range: " + value.dump());
      field = static_cast<int>(wide);
    }
  };
  for (auto& [key, _] : po.items()) {
    if (key == "n_sink") read(key, options.n_sink);
    else if (key == "window") read(key, options.window);
    else if (key == "kernel") read(key, options.kernel);
    else if (key == "pooling") read(key, options.pooling);
    else if (key == "group_reduce") read(key, options.group_reduce);
    else if (key == "stride") read(key, options.stride);
    else if (key == "summary") read(key, options.summary);
    else
      throw Error(path + ": unknown key \"policy_options." + key +
                  "\" (known: n_sink, window, kernel, pooling, group_reduce, stride, summary)");
  }
  try {
    check_policy_options(options);
  } catch (const Error& e) {
    throw Error(path + ": policy_options: " + e.what());
  }
  return options;
}

}  // namespace

std::string row_cell_key(const ResultRow& row) {
  auto fields = row.fields();
  std::string key;
  for (const auto& c : kIdentityColumns) key += fields[c] + "|";
  return key;
}

std::string SweepCell::key() const { return row_cell_key(identity_row(model, eval)); }

namespace {
std::string cell_label_of(const SweepCell& cell) {
  auto f = identity_row(cell.model, cell.eval).fields();
  std::string label = "task=" + f["task"] + " policy=" + f["policy"];
  for (const char* column : {"budget", "budget_tokens", "heavy_share"})
    if (!f[column].empty()) label += std::string(" ") + column + "=" + f[column];
  return label + " shots=" + f["shots"] + " seed=" + f["seed"];
}
}  // namespace

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
      plan.skipped.push_back("duplicate cell " + cell_label_of(cell) + ": listed twice in the config, run once");
    }
  }
  plan.cells = std::move(unique);
  return plan;
}

namespace {
SweepPlan expand_sweep_grid(const nlohmann::json& config, const std::string& path, const std::string& data_dir) {
  if (!config.is_object()) throw Error(path + ": a sweep config must be a JSON object");
  static const std::set<std::string> known = {
      "name", "description", "models", "tasks", "policies", "budgets", "budget_tokens", "heavy_shares",
      "protocols", "shots", "seeds", "limit", "mode", "score", "max_length", "bos", "policy_options",
      "predictions", "note", "temperature", "file_order", "slurm", "device", "dtype", "pipelines",
      "pipeline", "greedy",
      "analyze"};  // "analyze": run by `kvevict analyze --config`
  for (auto& [key, _] : config.items())
    if (!known.count(key)) throw Error(path + ": unknown key \"" + key + "\"");
  SweepPlan plan;
  plan.config = config;
  plan.config.erase("slurm");  // how to run, not what: not part of the sweep's identity
  auto models = axis<std::string>(config, path, "models", {"models/stories260K-hf"});
  auto tasks = axis<std::string>(config, path, "tasks", {});
  if (tasks.empty()) throw Error(path + ": \"tasks\" is required");
  for (const auto& t : tasks) make_task(t);  // unknown task fails here, naming the known ones
  auto policies = axis<std::string>(config, path, "policies", {"full"});
  auto budgets = axis<double>(config, path, "budgets", {});
  auto budget_tokens = axis<int>(config, path, "budget_tokens", {});
  auto shares = axis<double>(config, path, "heavy_shares", {-1.0});
  auto protocols = axis<std::string>(config, path, "protocols", {"stream"});
  auto shots = axis<int>(config, path, "shots", {0});
  auto seeds = axis<int>(config, path, "seeds", {42});
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
  // "limit": N for every task, or {"xsum": 5, "*": 100} per task.
  auto limit_for = [&](const std::string& task) {
    if (!config.contains("limit")) return -1;
    const auto& l = config["limit"];
    if (l.is_number_integer()) return l.get<int>();
    if (l.is_object()) {
      if (l.contains(task)) return l[task].get<int>();
      return l.value("*", -1);
    }
    throw Error(path + ": \"limit\" must be an integer or an object of task -> integer");
  };
  for (double b : budgets)
    if (b <= 0 || b > 1) throw Error(path + ": budget " + std::to_string(b) + " is outside (0, 1]");
  for (int t : budget_tokens)
    if (t <= 0) throw Error(path + ": budget_tokens " + std::to_string(t) + " must be positive");
  for (double s : shares)
    if (s != -1.0 && (s < 0 || s > 1)) throw Error(path + ": heavy share " + std::to_string(s) + " is outside [0, 1]");

  PolicyOptions base_options = read_policy_options(config, path);
  struct BudgetChoice {
    double ratio = -1;
    int tokens = -1;
  };
  std::vector<BudgetChoice> budget_choices;
  for (double b : budgets) budget_choices.push_back({b, -1});
  for (int t : budget_tokens) budget_choices.push_back({-1, t});

  for (const auto& model : models)
    for (const auto& task : tasks)
     for (Pipeline pipeline : pipelines)
      for (const auto& protocol : protocols)
        for (int shot : shots)
          for (int seed : seeds)
            for (const auto& policy : policies) {
              make_policy(policy, base_options);  // unknown policy fails here
              std::vector<std::pair<BudgetChoice, double>> variants;
              if (policy == "full") {
                variants.push_back({{}, -1});
              } else {
                if (budget_choices.empty())
                  throw Error(path + ": policy " + policy + " needs \"budgets\" or \"budget_tokens\"");
                for (const auto& b : budget_choices) {
                  if (uses_heavy_share(policy))
                    for (double s : shares) variants.push_back({b, s});
                  else
                    variants.push_back({b, -1});
                }
              }
              // A sim-only policy cannot generate: no generation-task cell for it.
              if (!make_policy(policy, base_options)->realisable() &&
                  make_task(task)->kind() == TaskKind::Generation) {
                plan.skipped.push_back(policy + " x " + task + ": a sim-only policy cannot generate");
                continue;
              }
              for (const auto& [b, share] : variants) {
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
                e.policy = policy;
                e.policy_options = base_options;
                e.policy_options.seed = static_cast<uint64_t>(seed);
                e.policy_options.budget.ratio = b.ratio;
                e.policy_options.budget.tokens = b.tokens;
                e.policy_options.budget.heavy_share = share;
                e.mode = parse_mode(config.value("mode", std::string("sim")));
                e.protocol = parse_protocol(protocol);
                // The H2O adaptor's log-likelihood is a mean unless the config says otherwise.
                e.score = parse_score_mode(config.value(
                    "score", std::string(pipeline == Pipeline::H2O ? "mean" : "sum")));
                e.max_length = config.value("max_length", 1024);
                e.temperature = config.value("temperature", 0.0);
                e.greedy = config.value("greedy", false);  // XSum under pipeline h2o
                e.sample_seed = static_cast<uint64_t>(seed);
                if (config.contains("bos")) e.bos = config["bos"].get<bool>();
                plan.cells.push_back(cell);
              }
            }
  return plan;
}
}  // namespace

namespace {

// Progress on stderr: a live line on a terminal, plain lines otherwise.
class ProgressReporter {
 public:
  ProgressReporter(int total_cells) : total_(total_cells), tty_(isatty(STDERR_FILENO)) {}
  void start_cell(int index, const std::string& label) {
    index_ = index;
    label_ = label;
    started_ = std::chrono::steady_clock::now();
    last_print_ = started_;
    if (!tty_) std::cerr << "[" << index_ << "/" << total_ << "] " << label_ << std::endl;
  }
  void examples(int done, int total) {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - started_).count();
    double rate = elapsed > 0 ? done / elapsed : 0;
    double eta = rate > 0 ? (total - done) / rate : 0;
    std::ostringstream line;
    line << "[" << index_ << "/" << total_ << "] " << label_ << "  examples " << done << "/" << total << "  "
         << std::fixed << std::setprecision(1) << rate << "/s  ETA " << static_cast<int>(eta) << "s";
    if (tty_) {
      std::cerr << "\r\033[K" << line.str() << std::flush;
    } else if (done == total || std::chrono::duration<double>(now - last_print_).count() > 10) {
      std::cerr << line.str() << std::endl;
      last_print_ = now;
    }
  }
  void end_cell() {
    if (tty_) std::cerr << std::endl;
  }

 private:
  int total_, index_ = 0;
  bool tty_;
  std::string label_;
  std::chrono::steady_clock::time_point started_, last_print_;
};

std::string cell_label(const SweepCell& cell) {
  const auto row = identity_row(cell.model, cell.eval);
  auto f = row.fields();
  std::string label = "task=" + f["task"] + " policy=" + f["policy"];
  if (!f["budget"].empty()) label += " budget=" + f["budget"];
  if (!f["budget_tokens"].empty()) label += " budget_tokens=" + f["budget_tokens"];
  if (!f["heavy_share"].empty()) label += " heavy_share=" + f["heavy_share"];
  label += " protocol=" + f["protocol"] + " pipeline=" + f["pipeline"] + " shots=" + f["shots"] + " seed=" + f["seed"];
  return label;
}

std::string sanitize(std::string s) {
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  return s;
}

std::string resolve_model(const std::string& model, const std::string& data_override) {
  if (fs::path(model).is_absolute() || fs::exists(model)) return model;
  return data_path(model, data_override);
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  write_file_atomically(path, j.dump(2) + "\n");  // checked: a failed write is an error
}

// Cells whose rows are all in results.csv. A kill can tear the one write() of a cell:
// the torn line is cut off (read_results_csv's repair) and a cell left with only some
// of its metric rows is removed, so it is redone whole.
std::set<std::string> finished_cells(const std::string& csv, const SweepPlan& plan) {
  std::set<std::string> finished;
  if (!fs::exists(csv)) return finished;
  auto rows = read_results_csv(csv, /*repair=*/true);
  std::map<std::string, size_t> expected, present;
  for (const auto& cell : plan.cells) expected[cell.key()] = make_task(cell.eval.task)->metric_names().size();
  for (const auto& row : rows) present[row_cell_key(row)]++;
  std::vector<ResultRow> kept;
  for (const auto& row : rows) {
    const auto key = row_cell_key(row);
    if (expected.count(key) && present[key] < expected[key]) continue;
    kept.push_back(row);
    finished.insert(key);
  }
  if (kept.size() != rows.size()) {
    const std::string tmp = temporary_path_beside(csv);
    fs::remove(tmp);
    append_rows_durably(tmp, kept);
    publish_file(tmp, csv);
  }
  return finished;
}

}  // namespace

int run_sweep(const SweepArgs& args, const std::string& data_override) {
  nlohmann::json config = read_json_file(args.config);
  if (!args.model.empty()) config["models"] = nlohmann::json::array({args.model});
  if (args.limit != -2) config["limit"] = args.limit;
  SweepPlan plan = expand_sweep(config, args.config, data_dir(data_override));
  int shard_index = 0, shard_count = 1;
  if (!args.shard.empty()) std::tie(shard_index, shard_count) = parse_shard(args.shard);
  ModelOptions model_options;  // "device": "cuda" runs the sweep on a GPU (e.g. a Slurm GPU partition)
  for (const char* key : {"device", "dtype"})
    if (config.contains(key) && !config[key].is_string()) throw Error(args.config + ": key \"" + key + "\" must be a string");
  model_options.device = config.value("device", model_options.device);
  model_options.dtype = config.value("dtype", model_options.dtype);
  parse_dtype(model_options.dtype);  // a bad name fails before anything is written

  // The output folder is checked and locked before any cell runs or anything is rewritten.
  if (fs::exists(args.out) && !fs::is_directory(args.out))
    throw Error("--out " + args.out + ": is a file, not a folder");
  fs::create_directories(args.out);
  FolderLock lock(args.out, args.wait);
  const std::string config_path = (fs::path(args.out) / "config.json").string();
  const std::string csv = (fs::path(args.out) / "results.csv").string();
  if (fs::exists(csv) && !fs::is_regular_file(csv)) throw Error(csv + ": is not a regular file");
  if (fs::exists(csv) && !fs::exists(config_path))
    throw Error(args.out + ": holds results.csv but no config.json, so its sweep is unknown; use another --out");
  nlohmann::json record = {{"config", plan.config}, {"shard", {shard_index, shard_count}}, {"cells", nlohmann::json::array()}};
  for (size_t i = 0; i < plan.cells.size(); ++i)
    if (static_cast<int>(i % shard_count) == shard_index) record["cells"].push_back(plan.cells[i].key());
  if (fs::exists(config_path)) {
    auto previous = read_json_file(config_path);
    if (previous["config"] != record["config"] || previous["shard"] != record["shard"])
      throw Error(config_path + ": this folder holds a different sweep config or shard; use another --out");
  }
  write_json_file(config_path, record);

  std::set<std::string> finished = finished_cells(csv, plan);

  std::vector<const SweepCell*> todo;
  int mine = 0;
  for (size_t i = 0; i < plan.cells.size(); ++i) {
    if (static_cast<int>(i % shard_count) != shard_index) continue;
    ++mine;
    if (!finished.count(plan.cells[i].key())) todo.push_back(&plan.cells[i]);
  }
  std::cerr << "sweep " << plan.cells.size() << " cells, this shard " << mine << ", already done "
            << mine - todo.size() << ", to run " << todo.size() << std::endl;

  const bool predictions = config.value("predictions", false);
  if (predictions) fs::create_directories(fs::path(args.out) / "predictions");
  std::map<std::string, std::unique_ptr<Model>> models;  // loaded once per process
  std::map<std::string, std::optional<EvalResult>> full_runs;
  for (const auto& note : plan.skipped) std::cerr << "skipped " << note << std::endl;
  ProgressReporter progress(static_cast<int>(todo.size()));
  int index = 0, failed = 0;
  for (const SweepCell* cell : todo) {
   try {
    progress.start_cell(++index, cell_label(*cell));
    auto& model = models[cell->model];
    if (!model) model = Model::load(resolve_model(cell->model, data_override), model_options);
    // Full-cache reference runs are shared by every policy cell with the same task settings.
    std::string full_key = cell->model + "|" + cell->eval.task + "|" + std::to_string(cell->eval.task_options.shots) +
                           "|" + std::to_string(cell->eval.task_options.seed) + "|" + score_mode_name(cell->eval.score) +
                           "|" + protocol_name(cell->eval.protocol) + "|" + pipeline_name(cell->eval.task_options.pipeline);
    EvalResult result = evaluate(*model, cell->eval, [&](int d, int t) { progress.examples(d, t); }, &full_runs[full_key]);
    if (cell->eval.policy == "full" && !full_runs[full_key]) full_runs[full_key] = result;
    progress.end_cell();
    if (predictions)
      write_predictions(result, cell->eval,
                        (fs::path(args.out) / "predictions" / (sanitize(cell->key()) + ".jsonl")).string());
    append_rows_durably(csv, eval_rows(cell->model, cell->eval, result));
   } catch (const Error& e) {
    // One bad cell does not stop the grid; it is reported and the exit code says so.
    progress.end_cell();
    std::cerr << "cell failed: " << cell_label(*cell) << ": " << e.what() << std::endl;
    ++failed;
   }
  }
  if (failed) throw Error(std::to_string(failed) + " of " + std::to_string(todo.size()) +
                          " cells failed (see above); finished cells are in " + csv);
  std::cerr << "sweep done: " << csv << std::endl;
  return 0;
}

int run_merge(const std::vector<std::string>& dirs, const std::string& out, bool wait) {
  if (dirs.empty()) throw Error("merge needs at least one folder");
  nlohmann::json config;
  std::set<int> shards_seen;
  int shard_count = -1;
  std::vector<ResultRow> rows;
  std::set<std::string> seen;
  for (const auto& dir : dirs) {
    const std::string path = (fs::path(dir) / "config.json").string();
    auto record = read_json_file(path);
    if (config.is_null()) config = record["config"];
    else if (record["config"] != config)
      throw Error(path + ": its sweep config differs from " + dirs[0] + "'s; refusing to merge");
    int count = record["shard"][1].get<int>();
    if (shard_count >= 0 && count != shard_count)
      throw Error(path + ": shard count " + std::to_string(count) + " differs from " + std::to_string(shard_count));
    shard_count = count;
    if (!shards_seen.insert(record["shard"][0].get<int>()).second)
      throw Error(path + ": shard " + record["shard"][0].dump() + " appears twice");
    for (auto& row : read_results_csv((fs::path(dir) / "results.csv").string())) {
      std::string key = row_cell_key(row) + row.metric;
      if (seen.insert(key).second) rows.push_back(row);
    }
  }
  if (static_cast<int>(shards_seen.size()) != shard_count)
    std::cerr << "warning: merged " << shards_seen.size() << " of " << shard_count << " shards" << std::endl;
  if (fs::exists(out) && !fs::is_directory(out)) throw Error("--out " + out + ": is a file, not a folder");
  fs::create_directories(out);
  FolderLock lock(out, wait);
  const std::string csv = (fs::path(out) / "results.csv").string();
  const std::string out_config = (fs::path(out) / "config.json").string();
  // A folder this same sweep was merged into before is merged again (shards may have grown).
  const bool remerge = fs::exists(out_config) && read_json_file(out_config).contains("merged_from") &&
                       read_json_file(out_config)["config"] == config;
  if (fs::exists(csv) && !remerge) throw Error(csv + ": already exists; merge into an empty folder");
  // Rows keep the unsharded run's cell order.
  SweepPlan plan = expand_sweep(config, "merged config", "");
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < plan.cells.size(); ++i) order[plan.cells[i].key()] = i;
  std::stable_sort(rows.begin(), rows.end(), [&](const ResultRow& a, const ResultRow& b) {
    return order[row_cell_key(a)] < order[row_cell_key(b)];
  });
  // Written beside and renamed over, so a reader never sees a half-merged file.
  if (!rows.empty()) {
    const std::string temporary = temporary_path_beside(csv);
    fs::remove(temporary);
    append_rows_durably(temporary, rows);
    publish_file(temporary, csv);
  }
  nlohmann::json record = {{"config", config}, {"shard", {0, 1}}, {"merged_from", dirs}, {"cells", nlohmann::json::array()}};
  for (const auto& c : plan.cells) record["cells"].push_back(c.key());
  write_json_file((fs::path(out) / "config.json").string(), record);
  std::cerr << "merged " << rows.size() << " rows into " << csv << std::endl;
  return 0;
}

}  // namespace kvevict
