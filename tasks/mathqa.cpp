// MathQA (the official test split, 2985 items in mathqa/test.json) as lm-eval 0.3's
// mathqa.MathQA: "Question: <Problem>\nAnswer:" continued by " <choice>" for each of the
// five choices that lm-eval's regex finds in `options`; gold = "abcde".index(correct).
//
// The official train split is not shipped (see ../shared/data/SOURCES.md), so few-shot
// runs need mathqa/train.json in the data folder (the official file, same format) and
// otherwise refuse: drawing examples from the test split would not be lm-eval's prompt.
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>

#include "harness/common/files.h"
#include "tasks/fewshot.h"
#include "tasks/jsonl.h"

namespace kvevict {
namespace {

const std::string kLetters = "abcde";
const char* kTrainFile = "mathqa/train.json";

// lm-eval's re.findall(r"[abcd] \) .*?, |e \) .*?$", options), each match minus its first
// 4 characters and right-stripped of " ,". The pattern is written for ECMAScript with
// Python's meanings: Python's `.` excludes only "\n" (ECMAScript's also excludes "\r"),
// and Python's `$` also matches just before a final "\n". On the 66 official items whose
// options are a Python-list string ("['a ) 2 : 3', 'b ) 4 : 5', ...]") this keeps the
// stray quotes and the closing bracket, exactly as lm-eval does.
std::vector<std::string> lm_eval_choices(const std::string& options) {
  static const std::regex pattern(R"([abcd] \) [^\n]*?, |e \) [^\n]*?(?=\n?$))",
                                  std::regex::ECMAScript | std::regex::optimize);
  std::vector<std::string> choices;
  for (auto it = std::sregex_iterator(options.begin(), options.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    std::string choice = it->str().substr(4);
    const size_t end = choice.find_last_not_of(" ,");
    choice.erase(end == std::string::npos ? 0 : end + 1);
    choices.push_back(std::move(choice));
  }
  return choices;
}

// A JSON string literal: keeps a one-line error one line whatever the text holds.
std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json read_json_array(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("missing data file: " + path);
  const nlohmann::json items = read_json_file(path);
  if (!items.is_array()) throw Error(path + ": expected a JSON array of MathQA items");
  return items;
}

std::vector<LmEvalDoc> load_mathqa(const std::string& path) {
  const nlohmann::json items = read_json_array(path);
  std::vector<LmEvalDoc> docs;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    const std::string where = path + ": item " + std::to_string(i);
    auto text_field = [&](const char* key) {
      if (!item.is_object() || !item.contains(key) || !item[key].is_string())
        throw Error(where + ": field \"" + key + "\" must be a string");
      return item[key].get<std::string>();
    };
    const std::string problem = text_field("Problem"), options = text_field("options"),
                      correct = text_field("correct");

    LmEvalDoc doc;
    doc.id = std::to_string(i);
    doc.text = "Question: " + problem + "\nAnswer:";
    doc.choice_texts = lm_eval_choices(options);
    if (doc.choice_texts.size() != kLetters.size())
      throw Error(where + ": options " + quoted(options) + " give " +
                  std::to_string(doc.choice_texts.size()) +
                  " choices with lm-eval's regex (expected 5: \"a ) ... , b ) ... , e ) ...\")");
    const size_t gold = correct.size() == 1 ? kLetters.find(correct) : std::string::npos;
    if (gold == std::string::npos)
      throw Error(where + ": correct " + quoted(correct) + " out of range (expected a, b, c, d or e)");
    for (const auto& choice : doc.choice_texts) doc.continuations.push_back(" " + choice);
    doc.gold = static_cast<int>(gold);
    doc.target = doc.continuations[doc.gold];
    doc.identity = nlohmann::json{doc.text, doc.choice_texts, doc.gold}.dump();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class MathQaTask : public Task {
 public:
  std::string name() const override { return "mathqa"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc", "acc_norm"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_mathqa(data_file(options.data_dir, "mathqa/test.json"));
    std::vector<LmEvalDoc> train;
    if (options.shots > 0) {
      const std::string train_path = data_file(options.data_dir, kTrainFile);
      if (!std::filesystem::exists(train_path))
        throw Error("mathqa: " + std::to_string(options.shots) +
                    "-shot needs MathQA's train split, which is not available (no " + train_path +
                    "; see the README's MathQA note); use --shots 0");
      train = load_mathqa(train_path);
    }
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_mathqa_task() { return std::make_unique<MathQaTask>(); }

}  // namespace kvevict
