// The server's requests as data: each route's JSON body read and checked field by field,
// and the OpenAI-style error a bad one gets. No LibTorch (fuzzed by
// fuzz/fuzz_server_request.cpp); the routes that need the model are in server.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "policies/policy.h"

namespace kvevict::server {

// A request the server refuses: the HTTP status and the OpenAI error object's fields.
// `param` names the field at fault ("" when the body as a whole is: then JSON null).
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, const std::string& message, std::string param = "",
               std::string type = "invalid_request_error", std::string code = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_, type_, code_;
};

// {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_json(const RequestError& error);

// What one request may ask for; the defaults are `kvevict serve`'s.
struct RequestLimits {
  int64_t max_body_bytes = 1 << 20;  // 1 MiB
  int max_prompts = 64;              // prompts in one request
  int max_tokens = 512;              // largest max_tokens
  int max_logprobs = 20;             // largest logprobs (OpenAI's own limit)
  int context = 0;                   // prompt + max_tokens tokens at most: the model's context
  int vocab_size = 0;                // token ids lie in [0, vocab_size)
};

// A prompt as the client sent it: text (tokenized by the server) or token ids (used verbatim).
struct Prompt {
  bool is_text = false;
  std::string text;
  std::vector<int> ids;
};

// The "kvevict" extension object: a policy for this request instead of the server's.
struct RequestPolicy {
  bool replaces_policy = false;  // "policy" or an option was given: use name + options
  std::string name;              // "" : the server's policy
  PolicyOptions options;
  int context_tokens = -1;  // prefill-compress: the prompt's first context_tokens are the context
};

struct CompletionRequest {
  std::vector<Prompt> prompts;
  int max_tokens = 16;
  double temperature = 1;
  std::uint64_t seed = 0;
  std::vector<std::string> stop;  // non-empty strings only
  int logprobs = -1;              // -1: none
  bool echo = false;
  bool stream = false;
  RequestPolicy policy;
};

// Each throws RequestError (400, or 413 for a body over the limit) naming the field.
CompletionRequest parse_completion_request(std::string_view body, const RequestLimits& limits);
// POST /tokenize {"prompt": text, "add_special_tokens": bool}: the text.
std::string parse_tokenize_request(std::string_view body, const RequestLimits& limits, bool* add_special_tokens);
// POST /detokenize {"tokens": [ids]}: the ids, each in the vocabulary.
std::vector<int> parse_detokenize_request(std::string_view body, const RequestLimits& limits);

// A prompt of `length` tokens (index `index` of the request) fits the limits with
// `max_tokens` more; throws RequestError naming "prompt".
void check_prompt_length(int length, int index, int max_tokens, const RequestLimits& limits);

}  // namespace kvevict::server
