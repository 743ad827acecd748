// A task's JSONL file, read as the task loaders read every line and field.
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "tasks/jsonl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvevict::fuzz::scratch_file("task.jsonl", data, size);
  try {
    for (const auto& line : kvevict::read_jsonl(path)) {
      // The typed accessors the loaders use; each either returns or throws with file:line.
      for (const char* key : {"premise", "question", "label", "goal", "sol1", "text", "idx"}) {
        try {
          line.string_field(key);
        } catch (const kvevict::Error&) {
        }
        try {
          line.int_field(key);
        } catch (const kvevict::Error&) {
        }
      }
    }
  } catch (const kvevict::Error&) {
  }
  return 0;
}
