// RTE as lm-eval 0.3's glue.RTE (the same 277 validation pairs as SuperGLUE RTE, which is
// the format shipped): "<premise>\nQuestion: <hypothesis> True or False?\nAnswer:" with
// the choices " True" (entailment, label 0) and " False" (not_entailment, label 1).
// Few-shot examples come from the full 2490-pair train split, as lm-eval draws them (the
// 32-example FewGLUE split only where the full one is not shipped).
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/jsonl.h"

namespace kvevict {
namespace {

std::vector<LmEvalDoc> load_rte(const std::string& path) {
  std::vector<LmEvalDoc> docs;
  for (const JsonLine& row : read_jsonl(path)) {
    const std::string label = row.string_field("label");
    if (label != "entailment" && label != "not_entailment")
      row.fail("label \"" + label + "\" out of range (expected entailment or not_entailment)");

    LmEvalDoc doc;
    doc.id = std::to_string(row.int_field("idx"));
    doc.text = row.string_field("premise") + "\nQuestion: " + row.string_field("hypothesis") +
               " True or False?\nAnswer:";
    doc.choice_texts = {"True", "False"};
    doc.continuations = {" True", " False"};
    doc.gold = label == "entailment" ? 0 : 1;
    doc.target = doc.continuations[doc.gold];
    doc.identity = row.value.dump();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class RteTask : public Task {
 public:
  std::string name() const override { return "rte"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_rte(data_file(options.data_dir, "rte/val.jsonl"));
    std::vector<LmEvalDoc> train;
    if (options.shots > 0)
      train = load_rte(training_split(options.data_dir, {"rte/train.jsonl", "rte/train32.jsonl"}));
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_rte_task() { return std::make_unique<RteTask>(); }

}  // namespace kvevict
