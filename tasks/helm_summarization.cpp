#include "tasks/helm_summarization.h"

#include "harness/common/limits.h"
#include "tasks/python_text.h"

namespace kvevict {

std::string helm_clean_and_truncate(const std::string& text, size_t max_words) {
  // str.split() already treats "\n" as whitespace, so replacing it first changes nothing.
  std::string out;
  size_t count = 0;
  for (const auto& word : python_split(text)) {
    if (count++ == max_words) break;
    if (!out.empty()) out += ' ';
    out += word;
  }
  return out;
}

std::string helm_summarization_block(const std::string& article, const std::string& instruction) {
  return "###\nArticle: " + article + "\n\n" + instruction + "\n";
}

GenerationDoc h2o_request_doc(const JsonLine& row, const std::string& id) {
  GenerationDoc doc;
  doc.id = id;
  doc.prompt = row.string_field("article");
  doc.reference = row.string_field("summary_gt");
  const long long max_tokens = row.int_field("max_tokens");
  if (max_tokens < 1 || max_tokens > kMaxModelPositions)
    row.fail("field \"max_tokens\" is " + std::to_string(max_tokens) + ", outside [1, " +
             std::to_string(kMaxModelPositions) + "] (the longest context a model may declare)");
  doc.max_new_tokens = static_cast<int>(max_tokens);
  const auto& temperature = row.field("temperature");
  if (!temperature.is_number() || !(temperature.get<double>() >= 0))
    row.fail("field \"temperature\" must be a number >= 0");
  doc.temperature = temperature.get<double>();
  const auto& stop = row.field("stop");
  if (!stop.is_array()) row.fail("field \"stop\" must be a list of strings");
  for (const auto& s : stop) {
    if (!s.is_string()) row.fail("field \"stop\" must be a list of strings");
    if (s.get<std::string>().empty())
      row.fail("field \"stop\" holds an empty string, which would end every generation before its first token");
    doc.stop.push_back(s.get<std::string>());
  }
  return doc;
}

}  // namespace kvevict
