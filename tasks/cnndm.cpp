// CNN/DailyMail (the first 1000 articles of the 1.0.0 test split, as CaM published them
// in H2O's request format: cnndm/cnndm_0shot.jsonl), scored with ROUGE. The two
// pipelines build different prompts from the same file:
// - H2O (TaskOptions::pipeline == Pipeline::H2O): each line's `article` exactly as it
//   is ("###\nArticle: " + the whole article, no instruction, no truncation), with the
//   line's max_tokens (64), temperature (0.3) and stop (["###"]). 0-shot only.
// - lm-eval (HELM's summarization_cnndm): the article cleaned and cut to 512 words,
//   "Summarize the above article in 3 sentences.", up to 128 new tokens, stop "###",
//   the output prefix kept as tasks/xsum.cpp keeps it. The file has no train split,
//   so, as for XSum, its last 100 articles are the few-shot pool whenever shots > 0
//   (one random.Random(seed).sample draw for every document) and are never evaluated.
#include <memory>

#include "tasks/fewshot.h"
#include "tasks/helm_summarization.h"
#include "tasks/jsonl.h"

namespace kvevict {
namespace {

const char* kFile = "cnndm/cnndm_0shot.jsonl";
const std::string kArticlePrefix = "###\nArticle: ";
const std::string kInstruction = "Summarize the above article in 3 sentences.";
constexpr size_t kFewshotPool = 100;
constexpr size_t kHelmMaxWords = 512;
constexpr int kHelmMaxTokens = 128;

std::vector<GenerationDoc> h2o_docs(const std::vector<JsonLine>& rows, const TaskOptions& options,
                                    const std::string& path) {
  if (options.shots != 0)
    throw Error("cnndm: the H2O pipeline uses " + path + " as it is, which is 0-shot; " +
                std::to_string(options.shots) + "-shot CNN/DM needs --pipeline lm-eval");
  size_t count = rows.size();
  if (options.limit >= 0) count = std::min(count, static_cast<size_t>(options.limit));
  std::vector<GenerationDoc> docs;
  for (size_t i = 0; i < count; ++i) docs.push_back(h2o_request_doc(rows[i], std::to_string(i)));
  return docs;
}

struct HelmDoc {
  std::string article, summary;
};

std::vector<GenerationDoc> helm_docs(const std::vector<JsonLine>& rows, const TaskOptions& options,
                                     const std::string& path) {
  std::vector<HelmDoc> source;
  for (const JsonLine& row : rows) {
    const std::string wrapped = row.string_field("article");
    if (wrapped.rfind(kArticlePrefix, 0) != 0)
      row.fail("field \"article\" does not start with \"###\\nArticle: \"");
    source.push_back({helm_clean_and_truncate(wrapped.substr(kArticlePrefix.size()), kHelmMaxWords),
                      helm_clean_and_truncate(row.string_field("summary_gt"))});
  }
  if (options.shots < 0) throw Error("cnndm: shots must be >= 0");
  const auto shots = static_cast<size_t>(options.shots);

  size_t evaluable = source.size();
  std::string prefix;  // the few-shot blocks, each followed by HELM's instance separator "\n"
  if (shots > 0) {
    if (source.size() <= kFewshotPool || shots > kFewshotPool)
      throw Error(path + ": " + std::to_string(shots) + "-shot CNN/DM needs more than " +
                  std::to_string(kFewshotPool) + " documents and at most " +
                  std::to_string(kFewshotPool) + " shots");
    evaluable = source.size() - kFewshotPool;
    PythonRandom rnd = PythonRandom::from_seed(options.seed);
    for (size_t pick : rnd.sample(kFewshotPool, shots)) {
      const HelmDoc& example = source[evaluable + pick];
      prefix += helm_summarization_block(example.article, kInstruction) + example.summary + "\n\n";
    }
  }
  if (options.limit >= 0) evaluable = std::min(evaluable, static_cast<size_t>(options.limit));

  std::vector<GenerationDoc> docs;
  for (size_t i = 0; i < evaluable; ++i) {
    GenerationDoc doc;
    doc.id = std::to_string(i);
    doc.prompt = prefix + helm_summarization_block(source[i].article, kInstruction);
    doc.reference = source[i].summary;
    doc.stop = {"###"};
    doc.max_new_tokens = kHelmMaxTokens;
    docs.push_back(std::move(doc));
  }
  return docs;
}

class CnnDmTask : public Task {
 public:
  std::string name() const override { return "cnndm"; }
  TaskKind kind() const override { return TaskKind::Generation; }
  std::vector<std::string> metric_names() const override { return {"rouge1", "rouge2", "rougeL"}; }

  std::vector<GenerationDoc> generation_docs(const TaskOptions& options) const override {
    const std::string path = data_file(options.data_dir, kFile);
    const auto rows = read_jsonl(path);
    return options.pipeline == Pipeline::H2O ? h2o_docs(rows, options, path)
                                             : helm_docs(rows, options, path);
  }
};

}  // namespace

std::unique_ptr<Task> make_cnndm_task() { return std::make_unique<CnnDmTask>(); }

}  // namespace kvevict
