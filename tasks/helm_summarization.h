// HELM's summarization prompt pieces (SummarizationScenario and
// get_summarization_adapter_spec), for the HELM-style generation tasks.
#pragma once
#include <string>

#include "tasks/jsonl.h"
#include "tasks/task.h"

namespace kvevict {

// SummarizationScenario._clean_and_truncate: newlines become spaces, then
// " ".join(text.split()[:max_words]); the default keeps every word.
std::string helm_clean_and_truncate(const std::string& text,
                                    size_t max_words = std::string::npos);

// One instance up to the model's answer: input_prefix "###\nArticle: ", the article,
// input_suffix "\n\n", then the output prefix `instruction` + "\n" (for example
// "Summarize the above article in 3 sentences.").
std::string helm_summarization_block(const std::string& article, const std::string& instruction);

// One line of the request files H2O's HELM run used (xsum_0shot.jsonl, cnndm_0shot.jsonl):
// the prompt `article` as it is, the reference `summary_gt`, `max_tokens` (1 up to the
// longest context a model may declare, kMaxModelPositions: a larger one can never be
// generated, and 10^12 used to wrap to a negative count), `temperature` (>= 0) and `stop`
// (strings, none empty: an empty one would end every generation before its first token).
// A field out of range fails with file:line and the key.
GenerationDoc h2o_request_doc(const JsonLine& row, const std::string& id);

}  // namespace kvevict
