// OpenBookQA (Main test split, 500 docs) as lm-eval 0.3's openbookqa.OpenBookQA: the
// question stem as context, " <choice>" for each of the four choices, answerKey A-D.
// Few-shot examples come from the Main train split, shipped only as train.tsv, whose
// "Choices" column reads "(A) ... (B) ... (C) ... (D) ...".
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/jsonl.h"
#include "tasks/python_text.h"

namespace kvevict {
namespace {

const std::vector<std::string> kLabels = {"A", "B", "C", "D"};

LmEvalDoc make_doc(std::string id, const std::string& stem, std::vector<std::string> choices,
                   int gold) {
  LmEvalDoc doc;
  doc.id = std::move(id);
  doc.text = stem;
  doc.choice_texts = std::move(choices);
  for (const auto& choice : doc.choice_texts) doc.continuations.push_back(" " + choice);
  doc.gold = gold;
  doc.target = doc.continuations[gold];
  doc.identity = nlohmann::json{doc.id, stem, doc.choice_texts, gold}.dump();
  return doc;
}

int gold_index(const std::string& answer_key, const std::string& where) {
  const std::string key = python_strip(answer_key);
  for (size_t i = 0; i < kLabels.size(); ++i)
    if (key == kLabels[i]) return static_cast<int>(i);
  throw Error(where + ": answer key \"" + answer_key + "\" out of range (expected A, B, C or D)");
}

std::vector<LmEvalDoc> load_jsonl_split(const std::string& path) {
  std::vector<LmEvalDoc> docs;
  for (const JsonLine& row : read_jsonl(path)) {
    const auto& question = row.field("question");
    if (!question.is_object() || !question.contains("stem") || !question["stem"].is_string() ||
        !question.contains("choices") || !question["choices"].is_array())
      row.fail("field \"question\" needs a \"stem\" string and a \"choices\" list");
    std::vector<std::string> choices;
    for (const auto& choice : question["choices"]) {
      if (!choice.contains("text") || !choice["text"].is_string()) row.fail("a choice has no text");
      choices.push_back(choice["text"].get<std::string>());
    }
    if (choices.size() != kLabels.size()) row.fail("expected 4 choices");
    docs.push_back(make_doc(row.string_field("id"), question["stem"].get<std::string>(),
                            std::move(choices),
                            gold_index(row.string_field("answerKey"), row.where())));
  }
  return docs;
}

// "(A) x (B) y (C) z (D) w" -> {x, y, z, w}.
std::vector<std::string> split_tsv_choices(const std::string& cell, const std::string& where) {
  std::vector<std::string> choices;
  size_t start = std::string::npos;
  for (size_t i = 0; i < kLabels.size(); ++i) {
    const std::string marker = (i == 0 ? "(" : " (") + kLabels[i] + ") ";
    const size_t at =
        i == 0 ? (cell.rfind(marker, 0) == 0 ? 0 : std::string::npos) : cell.find(marker, start);
    if (at == std::string::npos) throw Error(where + ": choices cell lacks \"" + marker + "\"");
    if (i > 0) choices.push_back(cell.substr(start, at - start));
    start = at + marker.size();
  }
  choices.push_back(cell.substr(start));
  return choices;
}

std::vector<LmEvalDoc> load_tsv_split(const std::string& path) {
  const TsvTable table = read_tsv(path);
  const size_t id = table.column("ID"), stem = table.column("Question Stem"),
               choices = table.column("Choices"), answer = table.column("Answer Key");
  std::vector<LmEvalDoc> docs;
  for (const TsvRow& row : table.rows) {
    const std::string where = path + ":" + std::to_string(row.line);
    docs.push_back(make_doc(row.cells[id], row.cells[stem],
                            split_tsv_choices(row.cells[choices], where),
                            gold_index(row.cells[answer], where)));
  }
  return docs;
}

class OpenBookQaTask : public Task {
 public:
  std::string name() const override { return "openbookqa"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc", "acc_norm"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_jsonl_split(data_file(options.data_dir, "openbookqa/test.jsonl"));
    std::vector<LmEvalDoc> train;
    if (options.shots > 0)
      train = load_tsv_split(data_file(options.data_dir, "openbookqa/train.tsv"));
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_openbookqa_task() { return std::make_unique<OpenBookQaTask>(); }

}  // namespace kvevict
