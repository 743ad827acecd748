// PIQA (validation, 1838 docs; labels in valid-labels.lst) as lm-eval 0.3's piqa.PiQA:
// "Question: <goal>\nAnswer:" continued by " <sol>". Few-shot examples come from the
// training split (train.jsonl + train-labels.lst) as lm-eval draws them; without it, the
// way lm-eval does for tasks without one: from the evaluation split, minus the document.
#include <filesystem>
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/jsonl.h"

namespace kvevict {
namespace {

std::vector<LmEvalDoc> load_piqa(const std::string& rows_path, const std::string& labels_path) {
  const auto rows = read_jsonl(rows_path);
  auto labels = read_text_lines(labels_path);
  if (!labels.empty() && labels.back().text.empty()) labels.pop_back();
  if (labels.size() != rows.size())
    throw Error(labels_path + ": " + std::to_string(labels.size()) + " labels for " +
                std::to_string(rows.size()) + " documents in " + rows_path);

  std::vector<LmEvalDoc> docs;
  for (size_t i = 0; i < rows.size(); ++i) {
    const JsonLine& row = rows[i];
    const std::string& label = labels[i].text;
    if (label != "0" && label != "1")
      throw Error(labels_path + ":" + std::to_string(labels[i].line) + ": label \"" + label +
                  "\" out of range (expected 0 or 1)");

    LmEvalDoc doc;
    doc.id = std::to_string(i);
    const std::string goal = row.string_field("goal");
    doc.text = "Question: " + goal + "\nAnswer:";
    doc.choice_texts = {row.string_field("sol1"), row.string_field("sol2")};
    for (const auto& choice : doc.choice_texts) doc.continuations.push_back(" " + choice);
    doc.gold = label == "0" ? 0 : 1;
    doc.target = doc.continuations[doc.gold];
    // lm-eval compares its processed doc {goal, choices, gold}.
    doc.identity = nlohmann::json{goal, doc.choice_texts, doc.gold}.dump();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class PiqaTask : public Task {
 public:
  std::string name() const override { return "piqa"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc", "acc_norm"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_piqa(data_file(options.data_dir, "piqa/valid.jsonl"),
                                data_file(options.data_dir, "piqa/valid-labels.lst"));
    const std::string train_rows = data_file(options.data_dir, "piqa/train.jsonl");
    const std::string train_labels = data_file(options.data_dir, "piqa/train-labels.lst");
    if (options.shots == 0 || !std::filesystem::exists(train_rows) || !std::filesystem::exists(train_labels))
      return lm_eval_requests(eval, nullptr, options, name());
    const auto train = load_piqa(train_rows, train_labels);
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_piqa_task() { return std::make_unique<PiqaTask>(); }

}  // namespace kvevict
