// config.json: every architecture's reader (model_type picks it), with a checkpoint that
// holds no tensors (OPT asks which prefix its tensors use).
#include "fuzz/fuzz_support.h"
#include "harness/model/architecture.h"
#include "harness/common/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  try {
    kvevict::describe_architecture(config, "config.json", [](const std::string&) { return false; });
  } catch (const kvevict::Error&) {
  }
  return 0;
}
