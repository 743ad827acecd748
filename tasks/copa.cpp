// COPA (SuperGLUE validation, 100 docs) as lm-eval 0.3's superglue.Copa: the premise
// without its final character plus " because" / " therefore"; each choice continues it
// with a lower-cased first letter. Few-shot examples come from the full 400-example
// SuperGLUE train split, as lm-eval draws them (the 32-example FewGLUE split only where
// the full one is not shipped).
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/jsonl.h"
#include "tasks/python_text.h"

namespace kvevict {
namespace {

std::vector<LmEvalDoc> load_copa(const std::string& path) {
  std::vector<LmEvalDoc> docs;
  for (const JsonLine& row : read_jsonl(path)) {
    const std::string question = row.string_field("question");
    if (question != "cause" && question != "effect")
      row.fail("question \"" + question + "\" is neither \"cause\" nor \"effect\"");
    const long long label = row.int_field("label");
    if (label != 0 && label != 1)
      row.fail("label " + std::to_string(label) + " out of range (expected 0 or 1)");

    LmEvalDoc doc;
    doc.id = std::to_string(row.int_field("idx"));
    const std::string connector = question == "cause" ? " because" : " therefore";
    doc.text = python_drop_last_char(python_strip(row.string_field("premise"))) + connector;
    for (const char* key : {"choice1", "choice2"}) {
      const std::string choice = python_lower_first_char(row.string_field(key));
      doc.choice_texts.push_back(choice);
      doc.continuations.push_back(" " + choice);
    }
    doc.gold = static_cast<int>(label);
    doc.target = doc.continuations[doc.gold];
    doc.identity = row.value.dump();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class CopaTask : public Task {
 public:
  std::string name() const override { return "copa"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_copa(data_file(options.data_dir, "copa/val.jsonl"));
    std::vector<LmEvalDoc> train;
    if (options.shots > 0)
      train = load_copa(training_split(options.data_dir, {"copa/train.jsonl", "copa/train32.jsonl"}));
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_copa_task() { return std::make_unique<CopaTask>(); }

}  // namespace kvevict
