// MathQA chain of thought (`mathqa_cot`): the official test split (mathqa/test.json, 2985
// items) as a generation task. Each prompt is lm-eval 0.3's few-shot layout (examples
// joined by "\n\n", then "\n\n" and the query) with
//   example = "Question: <Problem>\nOptions: <options>\nRationale: <Rationale>\nAnswer: <correct>"
//   query   = "Question: <Problem>\nOptions: <options>\nRationale:"
// The examples are drawn by lm-eval 0.3's sampler from the test split itself
// (tasks/fewshot.h: random.Random(seed).sample(test, shots + 1) minus the evaluated item,
// cut to `shots`), because MathQA's train split is not shipped (SOURCES.md): an item is
// never its own example. The model continues the rationale; generation stops before
// "\nQuestion:" (where a model that follows the layout starts the next example) or at
// max_new_tokens (256 by default: MathQA's longest rationales in a LLaMA-size vocabulary;
// --max-new-tokens overrides it). The answer letter is read off the generation by
// mathqa_cot_answer_letter (the last "answer ... <letter>", tasks/mathqa_cot.h); metrics
// `exact_match` (the letter equals `correct`; no letter is wrong) and `answer_found`
// (a letter was found), both means over the items in [0, 1].
//
// The text is cleaned before it is shown (the multiple-choice `mathqa` task is not: it
// keeps lm-eval's bytes): repair_spaced_mojibake on Problem, options and Rationale
// (MathQA's "ã —" for "×" and the like: 102 rationales and 13 problems); the Rationale's
// enclosing double quotes (2232 items have them, the rest none) removed; the 66 `options` written as
// a Python list ("['a ) 2 : 3', 'b ) 4 : 5', ...]") rewritten as the other 2919 are
// ("a ) 2 : 3 , b ) 4 : 5 , ..."). No ftfy pass: its NFKC would rewrite signs the
// rationales use ("²" to "2", "½" to "1⁄2").
#include <filesystem>
#include <memory>
#include <regex>

#include "harness/common/files.h"
#include "harness/common/utf8.h"
#include "tasks/fewshot.h"
#include "tasks/jsonl.h"
#include "tasks/mathqa_cot.h"
#include "tasks/metrics.h"

namespace kvevict {
namespace {

constexpr int kCotMaxNewTokens = 256;
const char* kCotStop = "\nQuestion:";

// windows-1252's characters for bytes 0x80..0x9F (0 where the standard codec has none:
// ftfy's sloppy codec reads those bytes as the C1 control of the same number).
constexpr char32_t kCotCp1252High[32] = {
    0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0, 0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178};

// The sloppy windows-1252 byte of a character; -1 when it has none.
int cot_cp1252_byte(char32_t c) {
  if (c >= 0xA0 && c <= 0xFF) return static_cast<int>(c);
  for (int b = 0; b < 32; ++b)
    if (kCotCp1252High[b] == c || (kCotCp1252High[b] == 0 && c == static_cast<char32_t>(0x80 + b))) return 0x80 + b;
  return -1;
}

// The uppercase of the lowercase letters windows-1252 has (MathQA's text was lowercased
// after its mojibake); other characters unchanged.
char32_t cot_cp1252_upper(char32_t c) {
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  switch (c) {
    case 0x0161: return 0x0160;  // š Š
    case 0x0153: return 0x0152;  // œ Œ
    case 0x017E: return 0x017D;  // ž Ž
    case 0x00FF: return 0x0178;  // ÿ Ÿ
    default: return c;
  }
}

// The bytes a mojibake character may stand for: its own, then its uppercase's.
std::vector<int> cot_byte_candidates(char32_t c) {
  std::vector<int> bytes;
  for (char32_t form : {c, cot_cp1252_upper(c)}) {
    const int b = cot_cp1252_byte(form);
    if (b >= 0 && (bytes.empty() || bytes.front() != b)) bytes.push_back(b);
  }
  return bytes;
}

bool cot_repairable_lead(int b) { return b == 0xC2 || b == 0xC3 || b == 0xCE || b == 0xCF || b == 0xE2; }

// One run of non-ASCII characters (spaces removed): each character either stays or starts
// a group that decodes as one UTF-8 character. Returns the pieces to join with spaces.
std::vector<std::string> cot_repair_run(const std::vector<std::string>& chars, const std::vector<char32_t>& points) {
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < points.size()) {
    bool joined = false;
    for (int lead : cot_byte_candidates(points[i])) {
      if (!cot_repairable_lead(lead)) continue;
      const size_t length = lead >= 0xE0 ? 3 : 2;
      if (i + length > points.size()) continue;
      std::string bytes(1, static_cast<char>(lead));
      for (size_t k = 1; k < length; ++k) {
        for (int b : cot_byte_candidates(points[i + k]))
          if (b >= 0x80 && b <= 0xBF) {
            bytes += static_cast<char>(b);
            break;
          }
      }
      if (bytes.size() != length) continue;
      const Utf8Char decoded = decode_utf8_at(bytes, 0);
      if (!decoded.valid || decoded.length != length) continue;
      pieces.push_back(bytes);
      i += length;
      joined = true;
      break;
    }
    if (!joined) pieces.push_back(chars[i++]);
  }
  return pieces;
}

std::string cot_strip_quotes(const std::string& text) {
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') return text.substr(1, text.size() - 2);
  return text;
}

// "['a ) 2 : 3', 'b ) 4 : 5', ...]" -> "a ) 2 : 3 , b ) 4 : 5 , ..."; anything that is
// not five such quoted choices is returned unchanged.
std::string cot_options_text(const std::string& options) {
  const std::string open = "['", close = "']", separator = "', '";
  if (options.size() < open.size() + close.size() || options.rfind(open, 0) != 0 ||
      options.compare(options.size() - close.size(), close.size(), close) != 0)
    return options;
  const std::string inner = options.substr(open.size(), options.size() - open.size() - close.size());
  std::vector<std::string> choices;
  size_t start = 0;
  while (true) {
    const size_t at = inner.find(separator, start);
    choices.push_back(inner.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + separator.size();
  }
  const std::string letters = "abcde";
  if (choices.size() != letters.size()) return options;
  std::string out;
  for (size_t k = 0; k < choices.size(); ++k) {
    if (choices[k].rfind(std::string(1, letters[k]) + " ) ", 0) != 0) return options;
    out += (k ? " , " : "") + choices[k];
  }
  return out;
}

std::string cot_quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct CotSource {
  MathQaCotItem item;
  std::string identity;  // the raw fields: equal items are one item to the sampler
};

std::vector<CotSource> load_mathqa_cot(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("missing data file: " + path);
  const nlohmann::json items = read_json_file(path);
  if (!items.is_array()) throw Error(path + ": expected a JSON array of MathQA items");
  std::vector<CotSource> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    const std::string where = path + ": item " + std::to_string(i);
    auto text_field = [&](const char* key) {
      if (!item.is_object() || !item.contains(key) || !item[key].is_string())
        throw Error(where + ": field \"" + key + "\" must be a string");
      return item[key].get<std::string>();
    };
    const std::string problem = text_field("Problem"), options = text_field("options"),
                      rationale = text_field("Rationale"), correct = text_field("correct");
    if (correct.size() != 1 || correct[0] < 'a' || correct[0] > 'e')
      throw Error(where + ": correct " + cot_quoted(correct) + " out of range (expected a, b, c, d or e)");
    CotSource source;
    source.item.problem = repair_spaced_mojibake(problem);
    source.item.options = repair_spaced_mojibake(cot_options_text(options));
    source.item.rationale = repair_spaced_mojibake(cot_strip_quotes(rationale));
    source.item.correct = correct[0];
    source.identity = nlohmann::json{problem, options, rationale, correct}.dump();
    out.push_back(std::move(source));
  }
  return out;
}

class MathQaCotTask : public Task {
 public:
  std::string name() const override { return "mathqa_cot"; }
  TaskKind kind() const override { return TaskKind::Generation; }
  std::vector<std::string> metric_names() const override { return {"exact_match", "answer_found"}; }

  std::vector<GenerationDoc> generation_docs(const TaskOptions& options) const override {
    if (options.pipeline != Pipeline::LmEval)
      throw Error("mathqa_cot: --pipeline h2o has no MathQA chain-of-thought prompt file; use --pipeline lm-eval");
    const auto sources = load_mathqa_cot(data_file(options.data_dir, "mathqa/test.json"));
    std::vector<std::string> identities;
    for (const auto& source : sources) identities.push_back(source.identity);
    const FewshotSchedule schedule = lm_eval_schedule(identities, std::nullopt, options, name());
    std::vector<GenerationDoc> docs;
    for (size_t s = 0; s < schedule.doc_order.size(); ++s) {
      const size_t index = schedule.doc_order[s];
      std::vector<std::string> examples;
      for (size_t e : schedule.examples[s])
        examples.push_back(mathqa_cot_query(sources[e].item) + mathqa_cot_target(sources[e].item));
      GenerationDoc doc;
      doc.id = std::to_string(index);
      doc.prompt = fewshot_context(examples, mathqa_cot_query(sources[index].item));
      doc.reference = std::string(1, sources[index].item.correct);
      doc.stop = {kCotStop};
      doc.max_new_tokens = kCotMaxNewTokens;
      docs.push_back(std::move(doc));
    }
    return docs;
  }

  std::optional<GenerationScores> score_generations(const std::vector<GenerationDoc>& docs,
                                                    const std::vector<std::string>& predictions) const override {
    if (docs.size() != predictions.size())
      throw Error("mathqa_cot: " + std::to_string(predictions.size()) + " predictions for " +
                  std::to_string(docs.size()) + " documents");
    GenerationScores scores;
    std::vector<double> found;
    for (size_t i = 0; i < docs.size(); ++i) {
      const std::optional<char> letter = mathqa_cot_answer_letter(predictions[i]);
      found.push_back(letter ? 1 : 0);
      scores.per_doc.push_back(letter && docs[i].reference == std::string(1, *letter) ? 1 : 0);
    }
    scores.metrics = {mean_metric("exact_match", scores.per_doc), mean_metric("answer_found", found)};
    return scores;
  }
};

}  // namespace

std::string mathqa_cot_query(const MathQaCotItem& item) {
  return "Question: " + item.problem + "\nOptions: " + item.options + "\nRationale:";
}

std::string mathqa_cot_target(const MathQaCotItem& item) {
  return " " + item.rationale + "\nAnswer: " + std::string(1, item.correct);
}

std::optional<char> mathqa_cot_answer_letter(const std::string& generation) {
  static const std::regex pattern(R"(\banswer\b[ \t]*(?:(?:is\b|:|=|option\b|\()[ \t]*)*([a-e])\b)",
                                  std::regex::ECMAScript | std::regex::optimize);
  std::string lowered = generation;
  for (char& c : lowered)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  std::optional<char> letter;
  for (auto it = std::sregex_iterator(lowered.begin(), lowered.end(), pattern); it != std::sregex_iterator(); ++it)
    letter = it->str(1)[0];
  return letter;
}

std::string repair_spaced_mojibake(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char first = decode_utf8_at(text, pos);
    if (!first.valid || first.value < 0x80) {
      out.append(text, pos, first.length);
      pos += first.length;
      continue;
    }
    // The run: this character, then every " " + non-ASCII character that follows.
    std::vector<std::string> chars{text.substr(pos, first.length)};
    std::vector<char32_t> points{first.value};
    pos += first.length;
    while (pos + 1 < text.size() && text[pos] == ' ') {
      const Utf8Char next = decode_utf8_at(text, pos + 1);
      if (!next.valid || next.value < 0x80) break;
      chars.push_back(text.substr(pos + 1, next.length));
      points.push_back(next.value);
      pos += 1 + next.length;
    }
    const std::vector<std::string> pieces = cot_repair_run(chars, points);
    for (size_t k = 0; k < pieces.size(); ++k) out += (k ? " " : "") + pieces[k];
  }
  return out;
}

std::unique_ptr<Task> make_mathqa_cot_task() { return std::make_unique<MathQaCotTask>(); }

}  // namespace kvevict
