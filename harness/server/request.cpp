#include "harness/server/request.h"

#include <cmath>
#include <limits>
#include <set>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "policies/budget.h"
#include "policies/params.h"
#include "policies/registry.h"

namespace kvevict::server {

namespace {

using nlohmann::json;

RequestError bad(const std::string& param, const std::string& message) { return RequestError(400, message, param); }

// What a JSON value is, for messages: "a string", "an array", "null", ...
std::string kind_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction or exponent";
    default: return "an integer";
  }
}

json parse_body(std::string_view body, const RequestLimits& limits) {
  if (static_cast<int64_t>(body.size()) > limits.max_body_bytes)
    throw RequestError(413, "request body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
                                std::to_string(limits.max_body_bytes) + " bytes");
  // nlohmann's reader would skip it; RFC 8259 forbids sending one, so say so.
  if (body.substr(0, 3) == "\xEF\xBB\xBF")
    throw bad("", "the request body starts with a UTF-8 byte-order mark: send the JSON without it");
  json j;
  try {
    j = parse_json(body, "request body");
  } catch (const std::exception& e) {
    throw bad("", e.what());
  }
  if (!j.is_object()) throw bad("", "request body must be a JSON object, not " + kind_of(j));
  return j;
}

// An integer field in [low, high]; JSON numbers with a fraction or exponent are refused.
long long integer_field(const json& value, const std::string& key, long long low, long long high) {
  long long v = 0;
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<long long>::max()))
      throw bad(key, "\"" + key + "\" " + std::to_string(u) + " is out of range [" + std::to_string(low) + ", " +
                         std::to_string(high) + "]");
    v = static_cast<long long>(u);
  } else if (value.is_number_integer()) {
    v = value.get<long long>();
  } else {
    throw bad(key, "\"" + key + "\" must be an integer, not " + kind_of(value));
  }
  if (v < low || v > high)
    throw bad(key, "\"" + key + "\" " + std::to_string(v) + " is out of range [" + std::to_string(low) + ", " +
                       std::to_string(high) + "]");
  return v;
}

double number_field(const json& value, const std::string& key, double low, double high) {
  if (!value.is_number()) throw bad(key, "\"" + key + "\" must be a number, not " + kind_of(value));
  const double v = value.get<double>();
  if (!std::isfinite(v) || v < low || v > high)
    throw bad(key, "\"" + key + "\" " + value.dump() + " is out of range [" + json(low).dump() + ", " +
                       json(high).dump() + "]");
  return v;
}

bool bool_field(const json& value, const std::string& key) {
  if (!value.is_boolean()) throw bad(key, "\"" + key + "\" must be true or false, not " + kind_of(value));
  return value.get<bool>();
}

std::vector<int> token_ids(const json& value, const std::string& where, const std::string& param,
                           const RequestLimits& limits) {
  std::vector<int> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!id.is_number_integer())
      throw bad(param, at + " must be an integer token id, not " + kind_of(id));
    const bool in_range = id.is_number_unsigned() ? id.get<std::uint64_t>() < static_cast<std::uint64_t>(limits.vocab_size)
                                                  : id.get<long long>() >= 0 && id.get<long long>() < limits.vocab_size;
    if (!in_range)
      throw bad(param, at + ": token id " + id.dump() + " is outside the vocabulary [0, " +
                           std::to_string(limits.vocab_size) + ")");
    ids.push_back(static_cast<int>(id.get<long long>()));
  }
  return ids;
}

// A NUL is no character of any text a tokenizer was trained on, and C strings end at it.
void check_no_nul(const std::string& text, const std::string& where, const std::string& param) {
  const size_t at = text.find('\0');
  if (at != std::string::npos)
    throw bad(param, where + " contains a NUL character (U+0000) at byte " + std::to_string(at));
}

std::vector<Prompt> read_prompts(const json& value, const RequestLimits& limits) {
  const std::string shapes = "a string, a list of strings, a list of token ids or a list of lists of token ids";
  std::vector<Prompt> prompts;
  if (value.is_string()) {
    prompts.push_back(Prompt{true, value.get<std::string>(), {}});
  } else if (value.is_array()) {
    if (value.empty()) throw bad("prompt", "\"prompt\" must not be empty");
    const json& first = value.front();
    if (first.is_number()) {
      prompts.push_back(Prompt{false, "", token_ids(value, "prompt", "prompt", limits)});
    } else if (first.is_string() || first.is_array()) {
      if (static_cast<int64_t>(value.size()) > limits.max_prompts)
        throw bad("prompt", "\"prompt\" holds " + std::to_string(value.size()) + " prompts; the limit is " +
                                std::to_string(limits.max_prompts) + " per request");
      for (size_t i = 0; i < value.size(); ++i) {
        const json& p = value[i];
        const std::string at = "prompt[" + std::to_string(i) + "]";
        if (first.is_string()) {
          if (!p.is_string()) throw bad("prompt", at + " must be a string like prompt[0], not " + kind_of(p));
          prompts.push_back(Prompt{true, p.get<std::string>(), {}});
        } else {
          if (!p.is_array()) throw bad("prompt", at + " must be a list of token ids like prompt[0], not " + kind_of(p));
          prompts.push_back(Prompt{false, "", token_ids(p, at, "prompt", limits)});
        }
      }
    } else {
      throw bad("prompt", "\"prompt\" must be " + shapes + "; prompt[0] is " + kind_of(first));
    }
  } else {
    throw bad("prompt", "\"prompt\" must be " + shapes + ", not " + kind_of(value));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const bool empty = prompts[i].is_text ? prompts[i].text.empty() : prompts[i].ids.empty();
    if (empty) throw bad("prompt", "prompt[" + std::to_string(i) + "] is empty: there is nothing to score or continue");
    if (prompts[i].is_text) check_no_nul(prompts[i].text, "prompt[" + std::to_string(i) + "]", "prompt");
  }
  return prompts;
}

std::vector<std::string> read_stop(const json& value) {
  std::vector<std::string> stop;
  auto add = [&](const json& s, const std::string& at) {
    if (!s.is_string()) throw bad("stop", at + " must be a string, not " + kind_of(s));
    // An empty stop string would end every generation before it starts; OpenAI ignores it.
    if (!s.get<std::string>().empty()) stop.push_back(s.get<std::string>());
  };
  if (value.is_null()) return stop;
  if (value.is_string()) {
    add(value, "\"stop\"");
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) add(value[i], "stop[" + std::to_string(i) + "]");
  } else {
    throw bad("stop", "\"stop\" must be a string or a list of strings, not " + kind_of(value));
  }
  return stop;
}

// The "kvevict" object: "policy", "context_tokens", the budget keys and every parameter a
// policy declares (policies/params.h), checked by the same declarations as the CLI flags.
RequestPolicy read_policy(const json& value) {
  if (!value.is_object()) throw bad("kvevict", "\"kvevict\" must be an object, not " + kind_of(value));
  RequestPolicy policy;
  BudgetSpec& budget = policy.options.budget;
  budget.keys = &kRequestBudgetKeys;
  for (const auto& [key, v] : value.items()) {
    const std::string param = "kvevict." + key;
    if (key == "policy") {
      if (!v.is_string()) throw bad(param, "\"" + param + "\" must be a policy name, not " + kind_of(v));
      policy.name = v.get<std::string>();
      if (policy.name.empty())
        throw bad(param, "\"" + param + "\" is empty: name a policy, or leave the key out for the server's");
      policy.replaces_policy = true;
    } else if (key == "context_tokens") {
      policy.context_tokens = static_cast<int>(integer_field(v, param, 1, std::numeric_limits<int>::max()));
    } else if (key == "budget") {
      budget.ratio = number_field(v, param, std::numeric_limits<double>::min(), 1);
      policy.replaces_policy = true;
    } else if (key == "budget_tokens") {
      budget.tokens = static_cast<int>(integer_field(v, param, 1, std::numeric_limits<int>::max()));
      policy.replaces_policy = true;
    } else if (key == "heavy_share" || key == "heavy_ratio" || key == "recent_ratio") {
      const double x = number_field(v, param, 0, 1);
      (key == "heavy_share" ? budget.heavy_share : key == "heavy_ratio" ? budget.heavy_ratio : budget.recent_ratio) = x;
      policy.replaces_policy = true;
    } else if (const ParamSpec* spec = find_policy_param(key)) {
      // A text parameter names a file (pattern_file): a file on the server, which a
      // request does not get to choose; it is set where the server starts.
      if (spec->kind() == ParamSpec::Kind::Text)
        throw bad(param, "\"" + param + "\" names a file on the server: set it with " + spec->cli_flag() +
                             " where the server starts, not in a request");
      const bool choice = spec->kind() == ParamSpec::Kind::Choice;
      if (choice ? !v.is_string() : !v.is_number())
        throw bad(param, "\"" + param + "\" must be " + (choice ? "a string" : "a number") + ", not " + kind_of(v));
      try {
        policy.options.params.set(*spec, choice ? v.get<std::string>() : v.dump(), param);
      } catch (const Error& e) {
        throw bad(param, e.what());
      }
      policy.replaces_policy = true;
    } else {
      std::string known = "policy, context_tokens, budget, budget_tokens, heavy_share, heavy_ratio, recent_ratio";
      for (const ParamSpec* p : all_policy_params()) known += ", " + p->key();
      throw bad(param, "unknown key \"" + param + "\" (known: " + known + ")");
    }
  }
  try {
    check_budget_spec(budget);
  } catch (const Error& e) {
    throw bad("kvevict", e.what());
  }
  if (policy.replaces_policy && !policy.name.empty()) {
    try {
      make_policy(policy.name, policy.options);
    } catch (const Error& e) {
      throw bad("kvevict.policy", e.what());
    }
  }
  return policy;
}

}  // namespace

nlohmann::json error_json(const RequestError& error) {
  json e = {{"message", error.what()}, {"type", error.type()}, {"param", nullptr}, {"code", nullptr}};
  if (!error.param().empty()) e["param"] = error.param();
  if (!error.code().empty()) e["code"] = error.code();
  return json{{"error", e}};
}

CompletionRequest parse_completion_request(std::string_view body, const RequestLimits& limits) {
  const json j = parse_body(body, limits);
  CompletionRequest request;
  bool has_prompt = false;
  for (const auto& [key, value] : j.items()) {
    // OpenAI's optional fields may be null: the default.
    if (value.is_null() && key != "prompt") continue;
    if (key == "prompt") {
      request.prompts = read_prompts(value, limits);
      has_prompt = true;
    } else if (key == "model") {
      if (!value.is_string()) throw bad(key, "\"model\" must be a string, not " + kind_of(value));
    } else if (key == "max_tokens") {
      request.max_tokens = static_cast<int>(integer_field(value, key, 0, limits.max_tokens));
    } else if (key == "temperature") {
      request.temperature = number_field(value, key, 0, 2);
    } else if (key == "top_p") {
      if (number_field(value, key, 0, 1) <= 0) throw bad(key, "\"top_p\" must be in (0, 1]");
    } else if (key == "n" || key == "best_of") {
      integer_field(value, key, 1, 1);
    } else if (key == "seed") {
      if (!value.is_number_integer()) throw bad(key, "\"seed\" must be an integer, not " + kind_of(value));
      try {
        request.seed = json_seed(value, "request body", key);
      } catch (const Error& e) {
        throw bad(key, e.what());
      }
    } else if (key == "stop") {
      request.stop = read_stop(value);
    } else if (key == "logprobs") {
      request.logprobs = static_cast<int>(integer_field(value, key, 0, limits.max_logprobs));
    } else if (key == "echo") {
      request.echo = bool_field(value, key);
    } else if (key == "stream") {
      request.stream = bool_field(value, key);
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      if (number_field(value, key, -2, 2) != 0) throw bad(key, "\"" + key + "\" is not supported: only 0");
    } else if (key == "logit_bias") {
      if (!value.is_object()) throw bad(key, "\"logit_bias\" must be an object, not " + kind_of(value));
      if (!value.empty()) throw bad(key, "\"logit_bias\" is not supported: only {}");
    } else if (key == "suffix") {
      if (!value.is_string()) throw bad(key, "\"suffix\" must be a string, not " + kind_of(value));
      if (!value.get<std::string>().empty()) throw bad(key, "\"suffix\" is not supported");
    } else if (key == "user") {
      if (!value.is_string()) throw bad(key, "\"user\" must be a string, not " + kind_of(value));
    } else if (key == "stream_options") {
      if (!value.is_object()) throw bad(key, "\"stream_options\" must be an object, not " + kind_of(value));
    } else if (key == "kvevict") {
      request.policy = read_policy(value);
    } else {
      throw bad(key, "unknown field \"" + key + "\"");
    }
  }
  if (!has_prompt) throw bad("prompt", "\"prompt\" is required");
  if (request.temperature > 0 && j.contains("top_p") && j["top_p"].is_number() && j["top_p"].get<double>() < 1)
    throw bad("top_p", "\"top_p\" below 1 (nucleus sampling) is not supported; sampling uses the whole distribution");
  for (size_t i = 0; i < request.prompts.size(); ++i)
    if (!request.prompts[i].is_text)
      check_prompt_length(static_cast<int>(request.prompts[i].ids.size()), static_cast<int>(i), request.max_tokens,
                          limits);
  return request;
}

void check_prompt_length(int length, int index, int max_tokens, const RequestLimits& limits) {
  if (static_cast<int64_t>(length) + max_tokens > limits.context)
    throw bad("prompt", "prompt[" + std::to_string(index) + "] has " + std::to_string(length) +
                            " tokens; with max_tokens " + std::to_string(max_tokens) +
                            " it exceeds the model's context of " + std::to_string(limits.context) + " tokens");
}

std::string parse_tokenize_request(std::string_view body, const RequestLimits& limits, bool* add_special_tokens) {
  const json j = parse_body(body, limits);
  std::optional<std::string> text;
  *add_special_tokens = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "prompt") {
      if (!value.is_string()) throw bad(key, "\"prompt\" must be a string, not " + kind_of(value));
      text = value.get<std::string>();
      check_no_nul(*text, "\"prompt\"", key);
    } else if (key == "add_special_tokens") {
      *add_special_tokens = bool_field(value, key);
    } else if (key != "model") {
      throw bad(key, "unknown field \"" + key + "\"");
    }
  }
  if (!text) throw bad("prompt", "\"prompt\" is required");
  return *text;
}

std::vector<int> parse_detokenize_request(std::string_view body, const RequestLimits& limits) {
  const json j = parse_body(body, limits);
  std::optional<std::vector<int>> ids;
  for (const auto& [key, value] : j.items()) {
    if (key == "tokens") {
      if (!value.is_array()) throw bad(key, "\"tokens\" must be a list of token ids, not " + kind_of(value));
      ids = token_ids(value, "tokens", "tokens", limits);
    } else if (key != "model") {
      throw bad(key, "unknown field \"" + key + "\"");
    }
  }
  if (!ids) throw bad("tokens", "\"tokens\" is required");
  return *ids;
}

}  // namespace kvevict::server
