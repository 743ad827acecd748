// results.csv: the strict reader (no repair: the scratch file is rewritten every run).
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "notebooks-export/results_csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvevict::fuzz::scratch_file("results.csv", data, size);
  try {
    for (const auto& row : kvevict::read_results_csv(path)) kvevict::format_row(row);
  } catch (const kvevict::Error&) {
  }
  return 0;
}
