// The server's request bodies (harness/server/request.h), as `kvevict serve` reads each
// route's body: /v1/completions (with the "kvevict" policy object, checked by the policies'
// declarations), /tokenize and /detokenize. RequestError is the expected answer to a bad
// body; the error body it makes must serialise.
#include <nlohmann/json.hpp>

#include "harness/server/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  kvevict::server::RequestLimits limits;
  limits.context = 512;  // stories260K's
  limits.vocab_size = 512;
  auto refused = [](const kvevict::server::RequestError& e) {
    (void)kvevict::server::error_json(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  try {
    const kvevict::server::CompletionRequest request = kvevict::server::parse_completion_request(body, limits);
    for (const auto& prompt : request.prompts)
      for (int id : prompt.ids)
        if (id < 0 || id >= limits.vocab_size) __builtin_trap();  // ids reach the model only in range
    if (request.max_tokens < 0 || request.max_tokens > limits.max_tokens) __builtin_trap();
  } catch (const kvevict::server::RequestError& e) {
    refused(e);
  }
  try {
    bool special = false;
    kvevict::server::parse_tokenize_request(body, limits, &special);
  } catch (const kvevict::server::RequestError& e) {
    refused(e);
  }
  try {
    for (int id : kvevict::server::parse_detokenize_request(body, limits))
      if (id < 0 || id >= limits.vocab_size) __builtin_trap();
  } catch (const kvevict::server::RequestError& e) {
    refused(e);
  }
  return 0;
}
