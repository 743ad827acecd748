// safetensors: the header of a checkpoint file (first byte 0) or a sharded checkpoint's
// index JSON (first byte 1).
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/model/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  try {
    if (data[0] == 0) {
      kvevict::parse_safetensors_header(data + 1, size - 1, "model.safetensors");
    } else {
      const auto index = kvevict::parse_json(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
                                             "model.safetensors.index.json");
      kvevict::parse_shard_index(index, "model.safetensors.index.json");
    }
  } catch (const kvevict::Error&) {
  }
  return 0;
}
