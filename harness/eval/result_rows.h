// The tidy results rows of one evaluation: the identity columns of its configuration
// plus one row per metric. `eval` prints them; the sweep appends them to results.csv.
#pragma once
#include <string>
#include <vector>

#include "harness/eval/evaluator.h"
#include "notebooks-export/results_csv.h"

namespace kvevict {

// identity_row (the identity columns of a configuration) is in harness/config/eval_config.h.
// identity_row plus each metric of the result.
std::vector<ResultRow> eval_rows(const std::string& model, const EvalConfig& config, const EvalResult& result);

}  // namespace kvevict
