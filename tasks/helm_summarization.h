// HELM's summarization prompt pieces (SummarizationScenario and
// get_summarization_adapter_spec), for the HELM-style generation tasks.
#pragma once
#include <string>

namespace kvevict {

// SummarizationScenario._clean_and_truncate: newlines become spaces, then
// " ".join(text.split()[:max_words]); the default keeps every word.
std::string helm_clean_and_truncate(const std::string& text,
                                    size_t max_words = std::string::npos);

// One instance up to the model's answer: input_prefix "###\nArticle: ", the article,
// input_suffix "\n\n", then the output prefix `instruction` + "\n" (for example
// "Summarize the above article in 3 sentences.").
std::string helm_summarization_block(const std::string& article, const std::string& instruction);

}  // namespace kvevict
