// DuoAttention (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with
// Retrieval and Streaming Heads", arXiv 2410.10819; kvpress's DuoAttentionPress): each KV
// head is either a retrieval head, which keeps the full cache, or a streaming head, which
// keeps the n_sink attention sinks and the most recent tokens. The paper trains a gate
// alpha_{l,h} per head mixing the two, attn = alpha x full + (1 - alpha) x streaming, and
// deploys it thresholded: alpha high -> full attention, low -> streaming attention.
//
// The heads' scores alpha_{l,h} (one per layer and KV head, as DuoAttention's released
// full_attention_heads.tsv holds them) come from pattern_file, clipped to [0, 1] as
// DuoAttention's loader does. The round(head_compression_ratio x L x H) lowest-scoring
// heads of the model (kvpress's round: halves to even; equal scores: the earlier layer,
// then the lower head, goes first) become streaming heads; the rest are retrieval heads.
//
// The budget: a streaming head holds the budget's tokens, int(ratio x length) or the token
// count: its n_sink sinks (fewer when the budget is smaller) and the newest rest; a
// retrieval head holds every token. So the whole cache keeps about
//   h x budget + (1 - h) x length tokens per layer and head, h = the streaming share,
// which is kvpress's compression_ratio = h x (1 - (sink + recent) / length). The budget
// has no heavy-hitter share; --kv-memory, a byte budget every head would hold, is refused.
//
// Pattern files: rows of layers, columns of KV heads, fields separated by tabs (DuoAttention's
// .tsv) or commas (.csv), one row per line, blank lines ignored; or JSON: an array of
// layers, each an array of numbers. A field that is not a finite number, rows of different
// lengths, or a shape that is not the model's layers x KV heads is refused, naming the
// file. The file is only read as numbers.
//
// Or, with calibration passkey instead of a file, the scores come from the model itself
// (the runtime's pre-pass, harness/runtime/prepass.h, once per model): a synthetic passkey
// prompt (Mohtashami and Jaggi 2023's passkey retrieval, the kind of data DuoAttention
// trains its gates on: filler text, the needle "The pass key is K. Remember it. K is the
// pass key." at half depth, then "What is the pass key? The pass key is") runs with full
// attention, and a KV head's score is
//   s_{l,h} = mean over the question's rows i and the query heads g of h's group of
//             sum over the needle's tokens j of attention_{l,g}(i, j),
// the share of attention the question pays the needle: a retrieval head looks back at it,
// a streaming head attends its sinks and neighbours. (kvpress's own on-the-fly scoring is a
// different proxy, over BookSum's mean queries and keys; this follows the passkey
// retrieval score.) The same round(ratio x L x H) lowest become streaming heads. A pattern
// file and calibration passkey together are refused.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "policies/policy.h"

namespace kvevict {
namespace {

const ParamSpec kPatternFile = ParamSpec::text(
    "pattern_file", "duo-attention: the heads' scores, [layer][KV head] (DuoAttention's full_attention_heads.tsv, CSV or JSON)");
const ParamSpec kCalibration = ParamSpec::choice(
    "calibration", {"none", "passkey"},
    "duo-attention: passkey scores the heads on the model itself (attention to a synthetic passkey), instead of a pattern_file");
const ParamSpec kHeadCompressionRatio =
    ParamSpec::real("head_compression_ratio", 0.5, "duo-attention: share of KV heads made streaming (the lowest-scoring)")
        .at_least(0)
        .at_most(1);

using HeadScores = std::vector<std::vector<double>>;  // [layer][KV head]

std::string pattern_where(const std::string& path) { return kPatternFile.key() + " \"" + path + "\""; }

double pattern_number(const std::string& field, const std::string& where) {
  size_t begin = field.find_first_not_of(" \r"), end = field.find_last_not_of(" \r");
  const std::string text = begin == std::string::npos ? "" : field.substr(begin, end - begin + 1);
  char* stop = nullptr;
  errno = 0;
  const double value = text.empty() ? 0 : std::strtod(text.c_str(), &stop);
  if (text.empty() || errno != 0 || *stop != '\0' || !std::isfinite(value))
    throw Error(where + ": \"" + text + "\" is not a finite number");
  return value;
}

HeadScores parse_delimited(const std::string& bytes, const std::string& where) {
  HeadScores rows;
  size_t line_start = 0;
  for (int line = 1; line_start < bytes.size(); ++line) {
    size_t line_end = bytes.find('\n', line_start);
    if (line_end == std::string::npos) line_end = bytes.size();
    const std::string text = bytes.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (text.find_first_not_of(" \r") == std::string::npos) continue;
    std::vector<double> row;
    size_t field_start = 0;
    for (int field = 1;; ++field) {
      const size_t field_end = text.find_first_of("\t,", field_start);
      row.push_back(pattern_number(text.substr(field_start, field_end - field_start),
                                   where + ", line " + std::to_string(line) + ", field " + std::to_string(field)));
      if (field_end == std::string::npos) break;
      field_start = field_end + 1;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

HeadScores parse_json_rows(const std::string& bytes, const std::string& where) {
  const nlohmann::json json = parse_json(bytes, where);
  if (!json.is_array()) throw Error(where + ": JSON must be an array of layers, each an array of numbers");
  HeadScores rows;
  for (size_t l = 0; l < json.size(); ++l) {
    if (!json[l].is_array()) throw Error(where + ": layer " + std::to_string(l) + " is not an array of numbers");
    std::vector<double> row;
    for (size_t h = 0; h < json[l].size(); ++h) {
      const auto& value = json[l][h];
      if (!value.is_number() || !std::isfinite(value.get<double>()))
        throw Error(where + ": [" + std::to_string(l) + "][" + std::to_string(h) + "] " + value.dump() +
                    " is not a finite number");
      row.push_back(value.get<double>());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// The file's scores, clipped to [0, 1]; kvevict::Error naming the file when it cannot be
// read or is not a rectangle of finite numbers.
HeadScores load_head_scores(const std::string& path) {
  const std::string where = pattern_where(path);
  std::string bytes;
  try {
    bytes = read_text_file(path);
  } catch (const Error&) {
    throw Error(where + ": cannot open file");
  }
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  HeadScores rows = first != std::string::npos && bytes[first] == '[' ? parse_json_rows(bytes, where)
                                                                       : parse_delimited(bytes, where);
  if (rows.empty() || rows[0].empty()) throw Error(where + ": no head scores");
  for (size_t l = 0; l < rows.size(); ++l) {
    if (rows[l].size() != rows[0].size())
      throw Error(where + ": layer " + std::to_string(l) + " has " + std::to_string(rows[l].size()) +
                  " head scores, layer 0 has " + std::to_string(rows[0].size()));
    for (double& score : rows[l]) score = std::min(1.0, std::max(0.0, score));
  }
  return rows;
}

// [layer][KV head]: 1 for a streaming head, the `ratio` share of lowest scores.
std::vector<std::vector<char>> streaming_heads(const HeadScores& scores, double ratio) {
  const int layers = static_cast<int>(scores.size()), heads = static_cast<int>(scores[0].size());
  std::vector<int> order(static_cast<size_t>(layers) * heads);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return scores[a / heads][a % heads] < scores[b / heads][b % heads]; });
  const int n_streaming = static_cast<int>(std::nearbyint(ratio * layers * heads));
  std::vector<std::vector<char>> streaming(layers, std::vector<char>(heads, 0));
  for (int i = 0; i < n_streaming; ++i) streaming[order[i] / heads][order[i] % heads] = 1;
  return streaming;
}

// One KV head: a retrieval head keeps every slot; a streaming head its sinks and the newest.
class DuoHeadState : public LayerState {
 public:
  DuoHeadState(Budget budget, bool streaming) : budget_(budget), streaming_(streaming) {}

  std::unique_ptr<LayerState> clone(LayerStateCopies&) const override { return std::make_unique<DuoHeadState>(*this); }
  void append(int position, const NewToken&) override { positions_.push_back(position); }
  void merge(int position, const NewToken&) override { positions_.back() = position; }
  void observe(const float*) override {}

  bool compress(std::vector<int>* keep) override {
    const int n = static_cast<int>(positions_.size());
    if (!streaming_ || budget_.unlimited || n == 0) return false;
    const int newest = positions_.back();
    if (!budget_.compresses_after(newest)) return false;
    const int capacity = budget_.capacity_after(newest);
    if (n <= capacity) return false;
    int n_sink = 0;
    while (n_sink < n && n_sink < capacity && positions_[n_sink] < budget_.sink) ++n_sink;
    kept_.clear();
    for (int s = 0; s < n_sink; ++s) kept_.push_back(s);
    for (int s = n - (capacity - n_sink); s < n; ++s) kept_.push_back(s);
    for (size_t i = 0; i < kept_.size(); ++i) positions_[i] = positions_[kept_[i]];
    positions_.resize(kept_.size());
    if (keep) *keep = kept_;
    return true;
  }

  const std::vector<int>& positions() const override { return positions_; }

 private:
  Budget budget_;
  bool streaming_;
  std::vector<int> positions_;
  std::vector<int> kept_;
};

class DuoAttentionPolicy : public RealisablePolicy {
 public:
  explicit DuoAttentionPolicy(const PolicyOptions& options) : RealisablePolicy(options) {
    // A byte budget sizes every head's cache; a retrieval head keeps every token.
    if (options_.kv_quant.memory > 0)
      throw Error(std::string(options_.kv_quant.keys->memory) +
                  " sizes every KV head's cache; policy duo-attention's retrieval heads keep every token (give it "
                  "--budget or --budget-tokens, the streaming heads' size)");
    if (calibrated_ && !pattern_file_.empty())
      throw Error("policy duo-attention takes its heads' scores from " + kPatternFile.cli_flag() + " or from " +
                  kCalibration.cli_flag() + " passkey, not both");
    if (!pattern_file_.empty())
      streaming_ = streaming_heads(load_head_scores(pattern_file_), options_.params.real(kHeadCompressionRatio));
  }
  std::string name() const override { return "duo-attention"; }
  std::vector<const ParamSpec*> parameters() const override {
    return {&kSink, &kPatternFile, &kCalibration, &kHeadCompressionRatio};
  }
  Prepass prepass() const override { return calibrated_ ? Prepass::PasskeyRetrieval : Prepass::None; }
  bool splits_budget() const override { return false; }
  int sink_tokens() const override { return static_cast<int>(options_.params.integer(kSink)); }
  Budget layer_budget(int layer, const SequenceShape& shape) const override {
    Budget budget = Policy::layer_budget(layer, shape);
    budget.recent = budget.capacity - budget.sink;  // a streaming head has no heavy hitters
    return budget;
  }

  void validate(const SequenceShape& shape) const override {
    check_pattern(shape);
    RealisablePolicy::validate(shape);
  }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    check_pattern(shape);
    LayerStates states;
    const Budget budget = layer_budget(layer, shape);
    const std::vector<std::vector<char>> streaming = calibrated_ ? calibrated_streaming(*shape.observed) : streaming_;
    for (int h = 0; h < shape.n_kv_heads; ++h)
      states.heads.push_back(std::make_unique<DuoHeadState>(budget, streaming[layer][h] != 0));
    return states;
  }

 private:
  // The heads the calibration's scores make streaming.
  std::vector<std::vector<char>> calibrated_streaming(const ObservedScores& table) const {
    HeadScores scores(table.n_layers, std::vector<double>(table.n_kv_heads));
    for (int l = 0; l < table.n_layers; ++l)
      for (int h = 0; h < table.n_kv_heads; ++h) scores[l][h] = table.at(l, h, 0);
    return streaming_heads(scores, options_.params.real(kHeadCompressionRatio));
  }

  void check_pattern(const SequenceShape& shape) const {
    if (calibrated_) {
      if (!shape.observed || shape.observed->kind != Prepass::PasskeyRetrieval)
        throw Error("policy duo-attention with " + kCalibration.cli_flag() +
                    " passkey needs the runtime's calibration pass, which this command does not run (use eval, sweep, "
                    "serve, generate or perplexity)");
      const ObservedScores& table = *shape.observed;
      if (table.n_layers != shape.n_layers || table.n_kv_heads != shape.n_kv_heads || table.positions != 1)
        throw Error("internal: duo-attention's calibration table is " + std::to_string(table.n_layers) + " x " +
                    std::to_string(table.n_kv_heads) + " for a model of " + std::to_string(shape.n_layers) + " x " +
                    std::to_string(shape.n_kv_heads));
      return;
    }
    if (pattern_file_.empty())
      throw Error("policy duo-attention needs " + kPatternFile.cli_flag() +
                  " (the heads' scores: DuoAttention's full_attention_heads.tsv, a CSV or JSON [layer][KV head]) or " +
                  kCalibration.cli_flag() + " passkey");
    const int layers = static_cast<int>(streaming_.size()), heads = static_cast<int>(streaming_[0].size());
    if (layers != shape.n_layers || heads != shape.n_kv_heads)
      throw Error(pattern_where(pattern_file_) + ": " + std::to_string(layers) + " layers x " + std::to_string(heads) +
                  " KV heads, the model has " + std::to_string(shape.n_layers) + " x " +
                  std::to_string(shape.n_kv_heads));
  }

  const std::string pattern_file_ = options_.params.text(kPatternFile);
  const bool calibrated_ = options_.params.text(kCalibration) == "passkey";
  std::vector<std::vector<char>> streaming_;  // [layer][KV head]
};
}  // namespace

std::unique_ptr<Policy> make_duo_attention_policy(const PolicyOptions& o) {
  return std::make_unique<DuoAttentionPolicy>(o);
}
}  // namespace kvevict
