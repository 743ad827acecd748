// XSum (the 1000 test documents H2O evaluated) with HELM's summarization prompt:
//   "###\nArticle: " + article + "\n\nSummarize the above article in 1 sentence.\n"
// followed, for a few-shot example, by its summary and "\n"; instances are joined by
// "\n" (HELM's instance_prefix). With default options the 0-shot prompt is byte-for-byte
// the `article` field of H2O's xsum_0shot.jsonl, whose articles HELM did not truncate;
// TaskOptions::xsum_helm_truncate applies HELM's 512-word cleaning instead.
//
// Few-shot examples must not be evaluated documents. XSum's train split is not shipped,
// so the last 100 of the 1000 documents are reserved as the example pool whenever
// shots > 0 (evaluation then covers at most the first 900). Like HELM, one draw
// (random.Random(seed).sample over the pool) serves every evaluated document, so the
// examples do not change with `limit`.
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/helm_summarization.h"
#include "tasks/jsonl.h"
#include "tasks/python_text.h"

namespace kvevict {
namespace {

constexpr size_t kFewshotPool = 100;
constexpr size_t kHelmMaxWords = 512;

std::string example_block(const std::string& article) {
  return helm_summarization_block(article, "Summarize the above article in 1 sentence.");
}

struct XsumDoc {
  std::string id, article, summary;
};

std::vector<XsumDoc> load_xsum(const std::string& path, bool helm_truncate) {
  std::vector<XsumDoc> docs;
  for (const JsonLine& row : read_jsonl(path)) {
    XsumDoc doc{std::to_string(row.int_field("idx")), row.string_field("document"),
                row.string_field("summary")};
    if (helm_truncate) {
      doc.article = helm_clean_and_truncate(doc.article, kHelmMaxWords);
      doc.summary = helm_clean_and_truncate(doc.summary);
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

// The H2O repository's HELM run reads its prompts from xsum_0shot.jsonl as they are:
// the prompt, the reference, the stop sequences, max_tokens and the temperature.
std::vector<GenerationDoc> h2o_prompt_file_docs(const TaskOptions& options) {
  const std::string path = data_file(options.data_dir, "xsum/xsum_0shot.jsonl");
  if (options.shots != 0)
    throw Error(path + ": --pipeline h2o uses H2O's 0-shot prompt file as it is; " + std::to_string(options.shots) +
                "-shot XSum needs --pipeline lm-eval");
  std::vector<GenerationDoc> out;
  for (const JsonLine& row : read_jsonl(path)) {
    if (options.limit >= 0 && out.size() >= static_cast<size_t>(options.limit)) break;
    out.push_back(h2o_request_doc(row, std::to_string(out.size())));
  }
  return out;
}

class XsumTask : public Task {
 public:
  std::string name() const override { return "xsum"; }
  TaskKind kind() const override { return TaskKind::Generation; }
  std::vector<std::string> metric_names() const override { return {"rouge1", "rouge2", "rougeL"}; }

  std::vector<GenerationDoc> generation_docs(const TaskOptions& options) const override {
    if (options.pipeline == Pipeline::H2O) return h2o_prompt_file_docs(options);
    const std::string path = data_file(options.data_dir, "xsum/xsum_test_1000.jsonl");
    const auto docs = load_xsum(path, options.xsum_helm_truncate);
    if (options.shots < 0) throw Error("xsum: shots must be >= 0");
    const auto shots = static_cast<size_t>(options.shots);

    size_t evaluable = docs.size();
    std::string prefix;  // the few-shot blocks, each followed by the instance separator
    if (shots > 0) {
      if (docs.size() <= kFewshotPool || shots > kFewshotPool)
        throw Error(path + ": " + std::to_string(shots) + "-shot XSum needs more than " +
                    std::to_string(kFewshotPool) + " documents and at most " +
                    std::to_string(kFewshotPool) + " shots");
      evaluable = docs.size() - kFewshotPool;
      PythonRandom rnd = PythonRandom::from_seed(options.seed);
      for (size_t pick : rnd.sample(kFewshotPool, shots)) {
        const XsumDoc& example = docs[evaluable + pick];
        prefix += example_block(example.article) + example.summary + "\n" + "\n";
      }
    }
    if (options.limit >= 0) evaluable = std::min(evaluable, static_cast<size_t>(options.limit));

    std::vector<GenerationDoc> out;
    for (size_t i = 0; i < evaluable; ++i) {
      GenerationDoc doc;
      doc.id = docs[i].id;
      doc.prompt = prefix + example_block(docs[i].article);
      doc.reference = docs[i].summary;
      doc.stop = {"###"};
      doc.max_new_tokens = 64;
      out.push_back(std::move(doc));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Task> make_xsum_task() { return std::make_unique<XsumTask>(); }

}  // namespace kvevict
