// The server's requests as it reads them: the bytes of a connection framed into whole
// requests (harness/server/http_framing.h: request line, headers, Content-Length against
// the body limit, pipelined requests one after another), and each request body as its
// route reads it (harness/server/request.h): /v1/completions (with the "kvevict" policy
// object, checked by the policies' declarations), /tokenize and /detokenize. The input is
// tried both as raw connection bytes and as a body. RequestError is the expected answer to
// a bad body; the error body it makes must serialise.
#include <nlohmann/json.hpp>

#include "harness/server/http_framing.h"
#include "harness/server/request.h"

namespace {

void parse_bodies(std::string_view body);

// Frames `bytes` as a connection's input, request after request, as the gate does; each
// refusal must be a 4xx with a message, each whole request must lie inside the input and
// hold its head and exactly Content-Length body bytes.
void frame_connection(std::string_view bytes) {
  kvevict::server::FramingLimits limits;
  limits.max_body_bytes = 4096;
  limits.max_head_bytes = 1024;
  for (int requests = 0; requests < 64 && !bytes.empty(); ++requests) {
    const kvevict::server::Framing framing = kvevict::server::frame_request(bytes, limits);
    using State = kvevict::server::Framing::State;
    if (framing.skipped > bytes.size()) __builtin_trap();
    if (framing.state == State::Refused) {
      if (framing.status < 400 || framing.status > 499 || framing.message.empty()) __builtin_trap();
      return;
    }
    if (framing.state == State::NeedMore) {
      // Not whole yet: never more than the limits allow to wait for.
      if (bytes.size() - framing.skipped > static_cast<size_t>(limits.max_head_bytes + limits.max_body_bytes) + 1)
        __builtin_trap();
      return;
    }
    const size_t whole = framing.skipped + framing.request_bytes;
    if (whole > bytes.size() || framing.head_bytes == 0 ||
        framing.request_bytes != framing.head_bytes + static_cast<size_t>(framing.content_length) ||
        framing.content_length > limits.max_body_bytes || framing.method.empty() || framing.target.empty())
      __builtin_trap();
    // The same request framed alone is the same request.
    const auto alone = kvevict::server::frame_request(bytes.substr(0, whole), limits);
    if (alone.state != State::Complete || alone.request_bytes != framing.request_bytes) __builtin_trap();
    parse_bodies(bytes.substr(framing.skipped + framing.head_bytes, static_cast<size_t>(framing.content_length)));
    bytes.remove_prefix(whole);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  frame_connection(bytes);
  parse_bodies(bytes);
  return 0;
}

namespace {

void parse_bodies(std::string_view body) {
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
}

}  // namespace
