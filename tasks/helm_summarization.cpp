#include "tasks/helm_summarization.h"

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

}  // namespace kvevict
