// Winogrande (1.1 dev, 1267 docs) as lm-eval 0.3's winogrande.Winogrande, by partial
// evaluation: the sentence up to the blank, filled with each option, is the context
// and the rest of the sentence (" " + stripped) is the shared continuation. A few-shot
// example is the sentence filled with its correct option, drawn from winogrande_xl train
// as lm-eval does (train_xl_noqid.jsonl: HF's rows, which have no qID); without it, from
// the dev split minus the document itself.
#include <filesystem>
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/jsonl.h"
#include "tasks/python_text.h"

namespace kvevict {
namespace {

std::vector<LmEvalDoc> load_winogrande(const std::string& path) {
  std::vector<LmEvalDoc> docs;
  for (const JsonLine& row : read_jsonl(path)) {
    const std::string sentence = row.string_field("sentence");
    const std::string answer = row.string_field("answer");
    if (answer != "1" && answer != "2")
      row.fail("answer \"" + answer + "\" out of range (expected \"1\" or \"2\")");
    const size_t blank = sentence.find('_');
    if (blank == std::string::npos) row.fail("sentence has no \"_\" blank");

    LmEvalDoc doc;
    // HF's winogrande_xl train rows carry no qID: the line number stands in.
    doc.id = row.value.contains("qID") ? row.string_field("qID") : std::to_string(row.line);
    const std::string before = sentence.substr(0, blank);
    const std::string continuation = " " + python_strip(sentence.substr(blank + 1));
    for (const char* key : {"option1", "option2"}) {
      const std::string option = row.string_field(key);
      doc.partial_contexts.push_back(before + option);
      doc.choice_texts.push_back(option);
      doc.continuations.push_back(continuation);
    }
    doc.gold = answer == "1" ? 0 : 1;
    doc.text = doc.partial_contexts[doc.gold];  // doc_to_text: filled with the right option
    doc.target = continuation;
    // lm-eval compares the dataset row {sentence, option1, option2, answer}.
    doc.identity =
        nlohmann::json{sentence, row.string_field("option1"), row.string_field("option2"), answer}
            .dump();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class WinograndeTask : public Task {
 public:
  std::string name() const override { return "winogrande"; }
  TaskKind kind() const override { return TaskKind::MultipleChoice; }
  std::vector<std::string> metric_names() const override { return {"acc"}; }
  std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions& options) const override {
    const auto eval = load_winogrande(data_file(options.data_dir, "winogrande/dev.jsonl"));
    const std::string train_path = data_file(options.data_dir, "winogrande/train_xl_noqid.jsonl");
    if (options.shots == 0 || !std::filesystem::exists(train_path))
      return lm_eval_requests(eval, nullptr, options, name());
    const auto train = load_winogrande(train_path);
    return lm_eval_requests(eval, &train, options, name());
  }
};

}  // namespace

std::unique_ptr<Task> make_winogrande_task() { return std::make_unique<WinograndeTask>(); }

}  // namespace kvevict
