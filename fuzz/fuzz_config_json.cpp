// config.json: every architecture's reader (model_type picks it), with a checkpoint that
// holds no tensors (OPT asks which prefix its tensors use).
#include "fuzz/fuzz_support.h"
#include "harness/model/architecture.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    // As Model::load reads it: parse_json, which refuses a key given twice.
    const auto config = kvevict::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    kvevict::describe_architecture(config, "config.json", [](const std::string&) { return false; });
  } catch (const kvevict::Error&) {
  }
  return 0;
}
