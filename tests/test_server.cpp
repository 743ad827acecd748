// `kvevict serve` driven over real HTTP: the real binary started on a free port, asked by
// httplib's client with the request shapes lm-eval's local-completions model sends, and
// its answers checked against `kvevict eval` and `kvevict generate` for the same tokens.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include "tests/catch.h"
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "harness/common/files.h"
#include "harness/tokenizers/tokenizer.h"
#include "tasks/task.h"
#include "tests/server_process.h"
#include "tests/test_support.h"

namespace kvevict {
namespace {

using nlohmann::json;

// The model's tokenizer (LibTorch-free: this file needs no model in-process).
const Tokenizer& stories_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_for_model(test::data("models/stories260K-hf"));
  return *tokenizer;
}

json post(const ServerProcess& server, const std::string& path, const json& body, int expect = 200) {
  auto client = server.client();
  auto res = client.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(res);
  INFO(res->body);
  REQUIRE(res->status == expect);
  return parse_json(res->body, path);
}

// The COPA documents eval scores with these task options (eval's defaults and --limit).
std::vector<MultipleChoiceDoc> copa_docs(int limit) {
  TaskOptions options;
  options.data_dir = test::data("");
  options.limit = limit;
  return make_task("copa")->multiple_choice_docs(options);
}

// Per document, eval's per-choice scores from its --predictions file.
std::vector<std::vector<double>> eval_scores(const std::string& flags, int limit, const std::string& name) {
  const std::string path = test::temp_dir("server_eval_" + name) + "/predictions.jsonl";
  auto run = test::run_kvevict("eval --task copa --limit " + std::to_string(limit) + " " + flags +
                               " --predictions " + path);
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  std::vector<std::vector<double>> scores;
  std::istringstream in(test::read_text(path));
  std::string line;
  while (std::getline(in, line)) scores.push_back(parse_json(line, path)["scores"].get<std::vector<double>>());
  return scores;
}

// lm-eval's loglikelihood request for COPA documents: context and continuation encoded
// separately (eval's own tokenization, no BOS), sent as one token-id prompt each, echo,
// max_tokens 1, logprobs 1; the answer summed as lm-eval sums it (token_logprobs[ctxlen:-1]).
std::vector<std::vector<double>> served_scores(const ServerProcess& server, const std::vector<MultipleChoiceDoc>& docs,
                                               const json& extension = nullptr) {
  const Tokenizer& tokenizer = stories_tokenizer();
  std::vector<std::vector<double>> scores;
  for (const auto& doc : docs) {
    json prompts = json::array();
    std::vector<size_t> context_lengths, lengths;
    for (const auto& request : doc.requests) {
      std::vector<int> whole = tokenizer.encode(request.context);
      context_lengths.push_back(whole.size());
      const auto continuation = tokenizer.encode(request.continuation);
      whole.insert(whole.end(), continuation.begin(), continuation.end());
      lengths.push_back(whole.size());
      prompts.push_back(whole);
    }
    json body = {{"model", "stories260K-hf"}, {"prompt", prompts}, {"temperature", 0}, {"max_tokens", 1},
                 {"logprobs", 1}, {"seed", 1234}, {"echo", true}};
    if (!extension.is_null()) body["kvevict"] = extension;
    const json answer = post(server, "/v1/completions", body);
    REQUIRE(answer["choices"].size() == doc.requests.size());
    std::vector<double> doc_scores;
    for (const auto& choice : answer["choices"]) {
      const size_t index = choice["index"].get<size_t>();
      const json& lp = choice["logprobs"];
      REQUIRE(lp["token_logprobs"].size() == lengths[index] + 1);  // the prompt and one generated token
      REQUIRE(lp["tokens"].size() == lengths[index] + 1);
      REQUIRE(lp["text_offset"].size() == lengths[index] + 1);
      CHECK(lp["token_logprobs"][0].is_null());
      CHECK(lp["top_logprobs"][0].is_null());
      double sum = 0;
      for (size_t i = context_lengths[index]; i + 1 < lp["token_logprobs"].size(); ++i) {
        sum += lp["token_logprobs"][i].get<double>();
        // lm-eval's greedy check: the entry is compared with the largest top value.
        const json& top = lp["top_logprobs"][i];
        REQUIRE(top.is_object());
        REQUIRE(!top.empty());
        double best = -1e300;
        for (const auto& [text, value] : top.items()) best = std::max(best, value.get<double>());
        CHECK(best >= lp["token_logprobs"][i].get<double>());
      }
      doc_scores.resize(doc.requests.size());
      doc_scores[index] = sum;
    }
    scores.push_back(doc_scores);
  }
  return scores;
}

void check_equal_scores(const std::vector<std::vector<double>>& served, const std::vector<std::vector<double>>& eval) {
  REQUIRE(served.size() == eval.size());
  for (size_t d = 0; d < served.size(); ++d) {
    REQUIRE(served[d].size() == eval[d].size());
    for (size_t c = 0; c < served[d].size(); ++c) {
      INFO("document " << d << " choice " << c);
      CHECK(std::isfinite(served[d][c]));
      CHECK(served[d][c] == eval[d][c]);  // the same pass, the same numbers
    }
  }
}

constexpr int kDocs = 6;

TEST_CASE("served COPA log-likelihoods equal kvevict eval's under full, h2o and h2o-paper", "[server]") {
  const auto docs = copa_docs(kDocs);
  REQUIRE(docs.size() == kDocs);
  SECTION("full cache (the server's default policy)") {
    ServerProcess server({}, "full");
    check_equal_scores(served_scores(server, docs), eval_scores("", kDocs, "full"));
  }
  SECTION("h2o from the server's flags, and from a request's kvevict object") {
    ServerProcess server({"--policy", "h2o", "--budget", "0.5"}, "h2o");
    const auto eval = eval_scores("--policy h2o --budget 0.5", kDocs, "h2o");
    check_equal_scores(served_scores(server, docs), eval);
    ServerProcess plain({}, "plain");
    check_equal_scores(served_scores(plain, docs, json{{"policy", "h2o"}, {"budget", 0.5}}), eval);
    // The policy does change the numbers.
    CHECK(served_scores(plain, docs) != eval);
  }
  SECTION("h2o-paper (sim-only) through the kvevict object") {
    ServerProcess server({}, "h2o_paper");
    const json extension = {{"policy", "h2o-paper"}, {"heavy_ratio", 0.2}, {"recent_ratio", 0.2}};
    check_equal_scores(served_scores(server, docs, extension),
                       eval_scores("--policy h2o-paper --heavy-ratio 0.2 --recent-ratio 0.2", kDocs, "h2o_paper"));
  }
  SECTION("decode mode") {
    ServerProcess server({"--mode", "decode", "--policy", "h2o", "--budget", "0.5"}, "decode");
    check_equal_scores(served_scores(server, docs), eval_scores("--mode decode --policy h2o --budget 0.5", kDocs, "decode"));
  }
  SECTION("decode mode with a token budget: a request's prompts share their context, the numbers do not move") {
    ServerProcess server({"--mode", "decode", "--policy", "tova", "--budget-tokens", "8"}, "decode_reuse");
    check_equal_scores(served_scores(server, docs),
                       eval_scores("--mode decode --policy tova --budget-tokens 8 --no-context-reuse", kDocs,
                                   "decode_reuse"));
  }
}

// [BOS] + the text's tokens: what `kvevict generate --prompt TEXT` runs on.
std::vector<int> generate_prompt(const std::string& text) {
  std::vector<int> ids = {test::read_json(test::data("models/stories260K-hf/config.json"))["bos_token_id"].get<int>()};
  const auto tokens = stories_tokenizer().encode(text);
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  return ids;
}

TEST_CASE("served greedy generations equal kvevict generate's, streamed or not", "[server]") {
  const std::string text = "Once upon a time, there was a little dog";
  for (const std::string policy : {"full", "h2o"}) {
    DYNAMIC_SECTION(policy) {
      const std::vector<std::string> flags =
          policy == "full" ? std::vector<std::string>{} : std::vector<std::string>{"--policy", "h2o", "--budget", "0.5"};
      ServerProcess server(flags, "gen_" + policy);
      auto cli = test::run_kvevict("generate --prompt '" + text + "' --max-new-tokens 40 --stream" +
                                   (policy == "full" ? std::string() : " --policy h2o --budget 0.5"));
      REQUIRE(cli.exit_code == 0);
      // lm-eval's generation request: token ids, stop list, max_tokens, temperature 0.
      const json body = {{"prompt", json::array({generate_prompt(text)})}, {"max_tokens", 40}, {"temperature", 0},
                         {"stop", json::array({"</s>"})}, {"seed", 1234}};
      const json answer = post(server, "/v1/completions", body);
      const std::string completion = answer["choices"][0]["text"].get<std::string>();
      CHECK(text + completion + "\n" == cli.out);
      CHECK(answer["usage"]["prompt_tokens"] == generate_prompt(text).size());
      // A stop string is cut from the text and ends generation.
      const std::string word = completion.substr(completion.size() / 2, 3);
      json stopped_body = body;
      stopped_body["stop"] = json::array({"\n\n", word});
      const json stopped = post(server, "/v1/completions", stopped_body);
      CHECK(stopped["choices"][0]["finish_reason"] == "stop");
      CHECK(stopped["choices"][0]["text"] == completion.substr(0, completion.find(word)));
      // Streamed: the chunks concatenate to the same text.
      json stream_body = body;
      stream_body["stream"] = true;
      auto client = server.client();
      auto res = client.Post("/v1/completions", stream_body.dump(), "application/json");
      REQUIRE(res);
      REQUIRE(res->status == 200);
      CHECK(res->get_header_value("Content-Type").find("text/event-stream") == 0);
      std::istringstream events(res->body);
      std::string line, streamed, finish;
      bool done = false;
      int chunks = 0;
      while (std::getline(events, line)) {
        if (line.empty()) continue;
        REQUIRE(line.rfind("data: ", 0) == 0);
        const std::string data = line.substr(6);
        if (data == "[DONE]") {
          done = true;
          continue;
        }
        const json chunk = parse_json(data, "chunk");
        streamed += chunk["choices"][0]["text"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
        ++chunks;
      }
      CHECK(done);
      CHECK(chunks > 2);
      CHECK(streamed == completion);
      CHECK(finish == answer["choices"][0]["finish_reason"].get<std::string>());
    }
  }
}

TEST_CASE("the tokenizer routes give the model tokenizer's encoding, and the small routes answer", "[server]") {
  ServerProcess server({}, "routes");
  const Tokenizer& tokenizer = stories_tokenizer();
  for (const std::string text : {"Once upon a time", " leading space", "a\nb", "", "naïve café ☃"}) {
    const json ids = post(server, "/tokenize", {{"prompt", text}, {"add_special_tokens", false}})["tokens"];
    CHECK(ids.get<std::vector<int>>() == tokenizer.encode(text));
    CHECK(post(server, "/detokenize", {{"tokens", ids}})["prompt"] == tokenizer.decode(ids.get<std::vector<int>>()));
  }
  CHECK(post(server, "/tokenize", {{"prompt", "Hi"}, {"add_special_tokens", true}})["tokens"].front() == 1);
  auto client = server.client();
  auto info = client.Get("/tokenizer_info");
  REQUIRE(info);
  CHECK(info->status == 200);
  CHECK(parse_json(info->body, "info").contains("eos_token"));
  auto models = client.Get("/v1/models");
  REQUIRE(models);
  CHECK(parse_json(models->body, "models")["data"][0]["id"] == "stories260K-hf");
  auto health = client.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  post(server, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 3}, {"temperature", 0}});
  auto metrics = client.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("kvevict_requests_total 1") != std::string::npos);
  CHECK(metrics->body.find("kvevict_queue_depth 0") != std::string::npos);
  CHECK(metrics->body.find("kvevict_generated_tokens_total 3") != std::string::npos);
  // Without echo, logprobs cover the generated tokens only; a request's text prompt works.
  const json answer = post(server, "/v1/completions",
                           {{"prompt", json::array({"Once upon", "The cat"})}, {"max_tokens", 4}, {"temperature", 0},
                            {"logprobs", 2}});
  REQUIRE(answer["choices"].size() == 2);
  for (const auto& choice : answer["choices"]) {
    CHECK(choice["logprobs"]["token_logprobs"].size() == 4);
    CHECK(choice["logprobs"]["top_logprobs"][0].size() >= 2);
  }
  CHECK(server.log().find("POST /v1/completions 200") != std::string::npos);
}

struct BadRequest {
  std::string name, method, path, body;
  int status;
  std::string names;  // the error's param, or a word its message holds
  std::string header = "";
};

TEST_CASE("bad requests get an OpenAI error naming the field, and the server keeps serving", "[server]") {
  ServerProcess server({"--api-key", "sesame", "--max-body-bytes", "4096", "--max-prompts", "4"}, "bad");
  const std::string ids600 = "[1, 600]";
  const std::vector<BadRequest> cases = {
      {"invalid JSON", "POST", "/v1/completions", "{\"prompt\": ", 400, "malformed JSON"},
      {"not an object", "POST", "/v1/completions", "[1, 2]", 400, "JSON object"},
      {"duplicate key", "POST", "/v1/completions", "{\"prompt\": \"a\", \"prompt\": \"b\"}", 400, "twice"},
      {"no prompt", "POST", "/v1/completions", "{\"max_tokens\": 1}", 400, "prompt"},
      {"prompt a number", "POST", "/v1/completions", "{\"prompt\": 5}", 400, "prompt"},
      {"empty prompt string", "POST", "/v1/completions", "{\"prompt\": \"\"}", 400, "prompt"},
      {"empty prompt list", "POST", "/v1/completions", "{\"prompt\": []}", 400, "prompt"},
      {"empty id list", "POST", "/v1/completions", "{\"prompt\": [[]]}", 400, "prompt"},
      {"id out of range", "POST", "/v1/completions", "{\"prompt\": " + ids600 + "}", 400, "prompt"},
      {"negative id", "POST", "/v1/completions", "{\"prompt\": [1, -3]}", 400, "prompt"},
      {"id not an integer", "POST", "/v1/completions", "{\"prompt\": [1, 2.5]}", 400, "prompt"},
      {"mixed prompt list", "POST", "/v1/completions", "{\"prompt\": [\"a\", [1]]}", 400, "prompt"},
      {"too many prompts", "POST", "/v1/completions", "{\"prompt\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "prompt"},
      {"prompt too long", "POST", "/v1/completions", "{\"prompt\": [" + [] {
         std::string s = "1";
         for (int i = 0; i < 600; ++i) s += ",5";
         return s;
       }() + "], \"max_tokens\": 0}", 400, "prompt"},
      {"prompt + max_tokens over the context", "POST", "/v1/completions",
       "{\"prompt\": [1,5,6,7], \"max_tokens\": 510}", 400, "prompt"},
      {"negative max_tokens", "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": -1}", 400, "max_tokens"},
      {"max_tokens a string", "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": \"5\"}", 400, "max_tokens"},
      {"max_tokens over the limit", "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 100000}", 400, "max_tokens"},
      {"n > 1", "POST", "/v1/completions", "{\"prompt\": \"a\", \"n\": 2}", 400, "n"},
      {"best_of 3", "POST", "/v1/completions", "{\"prompt\": \"a\", \"best_of\": 3}", 400, "best_of"},
      {"temperature 1e400", "POST", "/v1/completions", "{\"prompt\": \"a\", \"temperature\": 1e400}", 400, "malformed JSON"},
      {"negative temperature", "POST", "/v1/completions", "{\"prompt\": \"a\", \"temperature\": -1}", 400, "temperature"},
      {"top_p 0", "POST", "/v1/completions", "{\"prompt\": \"a\", \"top_p\": 0}", 400, "top_p"},
      {"logprobs 21", "POST", "/v1/completions", "{\"prompt\": \"a\", \"logprobs\": 21}", 400, "logprobs"},
      {"logprobs true", "POST", "/v1/completions", "{\"prompt\": \"a\", \"logprobs\": true}", 400, "logprobs"},
      {"echo a string", "POST", "/v1/completions", "{\"prompt\": \"a\", \"echo\": \"yes\"}", 400, "echo"},
      {"stop a number", "POST", "/v1/completions", "{\"prompt\": \"a\", \"stop\": 3}", 400, "stop"},
      {"stop list with a number", "POST", "/v1/completions", "{\"prompt\": \"a\", \"stop\": [\"x\", 3]}", 400, "stop"},
      {"seed a string", "POST", "/v1/completions", "{\"prompt\": \"a\", \"seed\": \"x\"}", 400, "seed"},
      {"unknown field", "POST", "/v1/completions", "{\"prompt\": \"a\", \"frobnicate\": 1}", 400, "frobnicate"},
      {"kvevict not an object", "POST", "/v1/completions", "{\"prompt\": \"a\", \"kvevict\": 1}", 400, "kvevict"},
      {"unknown policy", "POST", "/v1/completions", "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"nope\"}}", 400,
       "kvevict.policy"},
      {"unknown policy option", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"h2o\", \"wibble\": 2}}", 400, "kvevict.wibble"},
      {"budget out of range", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"h2o\", \"budget\": 1.5}}", 400, "kvevict.budget"},
      {"budget and budget_tokens", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"h2o\", \"budget\": 0.5, \"budget_tokens\": 4}}", 400,
       "kvevict.budget"},
      {"a file named in a request", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"duo-attention\", \"budget\": 0.5, \"pattern_file\": "
       "\"/etc/hostname\"}}",
       400, "kvevict.pattern_file"},
      {"policy parameter out of range", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"streaming\", \"budget\": 0.5, \"n_sink\": -5}}", 400, "n_sink"},
      {"token budget under the policy's sink tokens", "POST", "/v1/completions",
       "{\"prompt\": [1, 5, 6, 7, 8], \"echo\": true, \"logprobs\": 1, \"max_tokens\": 0, \"kvevict\": {\"policy\": "
       "\"streamingllm\", \"budget_tokens\": 2}}",
       400, "sink"},
      {"a byte-order mark before the JSON", "POST", "/v1/completions", "\xEF\xBB\xBF{\"prompt\": \"a\"}", 400,
       "byte-order mark"},
      {"a prompt of NUL characters", "POST", "/v1/completions", "{\"prompt\": \"\\u0000\\u0000\"}", 400, "NUL"},
      {"tokenize a NUL character", "POST", "/tokenize", "{\"prompt\": \"a\\u0000\"}", 400, "NUL"},
      {"an empty policy name", "POST", "/v1/completions", "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"\"}}", 400,
       "kvevict.policy"},
      {"a heavy share for the full cache", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"full\", \"heavy_share\": 0.3}}", 400, "kvevict.heavy_share"},
      {"a parameter the policy does not take", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"kvevict\": {\"policy\": \"h2o\", \"budget\": 0.5, \"n_sink\": 2}}", 400,
       "kvevict.n_sink"},
      {"context_tokens on a stream server", "POST", "/v1/completions",
       "{\"prompt\": \"a b c\", \"kvevict\": {\"context_tokens\": 1}}", 400, "kvevict.context_tokens"},
      {"a negative seed", "POST", "/v1/completions", "{\"prompt\": \"a\", \"seed\": -1}", 400, "seed"},
      {"sim-only policy asked to generate", "POST", "/v1/completions",
       "{\"prompt\": \"a\", \"max_tokens\": 5, \"kvevict\": {\"policy\": \"h2o-paper\", \"heavy_ratio\": 0.1, "
       "\"recent_ratio\": 0.1}}",
       400, "max_tokens"},
      {"body over the limit", "POST", "/v1/completions", "{\"prompt\": \"" + std::string(5000, 'a') + "\"}", 413, ""},
      {"tokenize without prompt", "POST", "/tokenize", "{}", 400, "prompt"},
      {"tokenize prompt a list", "POST", "/tokenize", "{\"prompt\": [1]}", 400, "prompt"},
      {"detokenize id out of range", "POST", "/detokenize", "{\"tokens\": [1, 512]}", 400, "tokens"},
      {"detokenize tokens a string", "POST", "/detokenize", "{\"tokens\": \"1 2\"}", 400, "tokens"},
      {"no such route", "GET", "/v2/nothing", "", 404, "/v2/nothing"},
      {"no API key", "POST", "/v1/completions", "{\"prompt\": \"a\"}", 401, "API key", "none"},
      {"wrong API key", "GET", "/health", "", 401, "API key", "Bearer wrong"},
  };
  REQUIRE(cases.size() >= 30);
  for (const auto& c : cases) {
    INFO(c.name << ": " << c.body.substr(0, 200));
    httplib::Client client = server.client();
    httplib::Headers headers;
    if (c.header != "none") headers.emplace("Authorization", c.header.empty() ? "Bearer sesame" : c.header);
    auto res = c.method == "GET" ? client.Get(c.path.c_str(), headers)
                                 : client.Post(c.path.c_str(), headers, c.body, "application/json");
    REQUIRE(res);
    INFO(res->body);
    CHECK(res->status == c.status);
    const json error = parse_json(res->body, "error body")["error"];
    for (const char* field : {"message", "type", "param", "code"}) CHECK(error.contains(field));
    if (!c.names.empty()) {
      const bool named = (error["param"].is_string() && error["param"].get<std::string>() == c.names) ||
                         error["message"].get<std::string>().find(c.names) != std::string::npos;
      CHECK(named);
    }
    auto health = client.Get("/health", httplib::Headers{{"Authorization", "Bearer sesame"}});
    REQUIRE(health);
    CHECK(health->status == 200);
  }
}

TEST_CASE("concurrent clients get the answers one client gets; a full queue gives 503; SIGTERM finishes the request",
          "[server]") {
  const auto docs = copa_docs(2);
  const Tokenizer& tokenizer = stories_tokenizer();
  json prompts = json::array();
  for (const auto& r : docs[0].requests) {
    auto ids = tokenizer.encode(r.context);
    auto cont = tokenizer.encode(r.continuation);
    ids.insert(ids.end(), cont.begin(), cont.end());
    prompts.push_back(ids);
  }
  const json scoring = {{"prompt", prompts}, {"max_tokens", 1}, {"logprobs", 1}, {"echo", true}, {"temperature", 0},
                        {"kvevict", {{"policy", "h2o"}, {"budget", 0.5}}}};
  const json generation = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0}};
  // The answer without its per-request id and time.
  auto answer_bytes = [](const std::string& body) {
    json j = parse_json(body, "answer");
    j.erase("id");
    j.erase("created");
    return j.dump();
  };
  SECTION("8 clients at once") {
    ServerProcess server({"--workers", "2", "--mode", "decode"}, "concurrent");
    std::vector<std::string> alone;
    for (const json& body : {scoring, generation}) {
      auto res = server.client().Post("/v1/completions", body.dump(), "application/json");
      REQUIRE(res);
      REQUIRE(res->status == 200);
      alone.push_back(answer_bytes(res->body));
    }
    std::vector<std::string> got(16);
    std::vector<int> status(16, 0);
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c)
      clients.emplace_back([&, c] {
        for (int k = 0; k < 2; ++k) {
          auto res = server.client().Post("/v1/completions", (k == 0 ? scoring : generation).dump(), "application/json");
          if (!res) continue;
          status[2 * c + k] = res->status;
          got[2 * c + k] = res->body;
        }
      });
    for (auto& t : clients) t.join();
    for (int i = 0; i < 16; ++i) {
      INFO("client " << i / 2 << " request " << i % 2);
      REQUIRE(status[i] == 200);
      CHECK(answer_bytes(got[i]) == alone[i % 2]);
    }
  }
  SECTION("a full queue answers 503 with Retry-After") {
    ServerProcess server({"--workers", "1", "--max-queue", "0", "--mode", "decode"}, "queue");
    const json slow = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0},
                       {"kvevict", {{"policy", "h2o"}, {"budget", 0.5}}}};
    std::vector<int> status(6, 0);
    std::vector<std::string> retry(6);
    std::vector<std::thread> clients;
    for (int c = 0; c < 6; ++c)
      clients.emplace_back([&, c] {
        auto res = server.client().Post("/v1/completions", slow.dump(), "application/json");
        if (!res) return;
        status[c] = res->status;
        retry[c] = res->get_header_value("Retry-After");
      });
    for (auto& t : clients) t.join();
    int ok = 0, busy = 0;
    for (int c = 0; c < 6; ++c) {
      if (status[c] == 200) ++ok;
      if (status[c] == 503) {
        ++busy;
        CHECK(!retry[c].empty());
      }
    }
    CHECK(ok >= 1);
    CHECK(busy >= 1);
    CHECK(ok + busy == 6);
    auto health = server.client().Get("/health");
    REQUIRE(health);
    CHECK(health->status == 200);
  }
  SECTION("SIGTERM during a request lets it finish, then the server exits 0 (batch size 1 and 2)") {
    const std::string batch = GENERATE("1", "2");
    ServerProcess server({"--mode", "decode", "--batch-size", batch}, "sigterm_" + batch);
    const json slow = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0},
                       {"kvevict", {{"policy", "h2o"}, {"budget", 0.5}}}};
    std::atomic<int> status{0};
    std::string body;
    std::thread client([&] {
      auto res = server.client().Post("/v1/completions", slow.dump(), "application/json");
      if (res) {
        body = res->body;
        status = res->status;
      } else {
        status = -1;
      }
    });
    // Wait until the request is being computed.
    bool running = false;
    for (int i = 0; i < 400 && !running && status == 0; ++i) {
      auto metrics = server.client().Get("/metrics");
      running = metrics && metrics->body.find("kvevict_requests_running 1") != std::string::npos;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const int exit_code = server.terminate();
    client.join();
    CHECK(running);
    CHECK(status == 200);
    CHECK(parse_json(body, "answer")["choices"][0]["text"].get<std::string>().size() > 0);
    CHECK(exit_code == 0);
  }
}


// One request's answer as it can be compared across servers: the body without its
// per-request id and time; a streamed one as its text, finish reasons and [DONE].
std::string comparable_answer(const json& body, int status, const std::string& answer) {
  if (status != 200) return std::to_string(status) + " " + answer;
  if (!body.value("stream", false)) {
    json j = parse_json(answer, "answer");
    j.erase("id");
    j.erase("created");
    return j.dump();
  }
  std::istringstream events(answer);
  std::string line, text, finish, tail;
  int chunks = 0;
  while (std::getline(events, line)) {
    if (line.empty()) continue;
    if (line == "data: [DONE]") {
      tail = "[DONE]";
      continue;
    }
    const json chunk = parse_json(line.substr(6), "chunk");
    if (chunk.contains("error")) return "error " + chunk.dump();
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
    ++chunks;
  }
  // Text arrives as it is made: several chunks, not one at the end.
  return "stream " + std::string(chunks > 2 ? "chunked" : "one piece") + " " + finish + " " + tail + " " + text;
}

// Per metric line "name value" (or "name{labels} value"): the value.
double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  FAIL("no metric " << name << " in\n" << text);
  return 0;
}

TEST_CASE("batched serving: concurrent clients get batch 1's answers bit for bit; a bad request is answered alone",
          "[server]") {
  const auto docs = copa_docs(4);
  const Tokenizer& tokenizer = stories_tokenizer();
  const json h2o = {{"policy", "h2o"}, {"budget", 0.5}};
  // lm-eval's shapes at several lengths, so that batches are ragged: loglikelihood requests
  // (a document's choices as token ids), echoed prompt scores, greedy and sampled
  // generations with log-probs, streamed generations; and two a policy refuses.
  std::vector<json> requests;
  for (const auto& doc : docs) {
    json prompts = json::array();
    for (const auto& r : doc.requests) {
      auto ids = tokenizer.encode(r.context);
      auto cont = tokenizer.encode(r.continuation);
      ids.insert(ids.end(), cont.begin(), cont.end());
      prompts.push_back(ids);
    }
    requests.push_back({{"prompt", prompts}, {"max_tokens", 1}, {"logprobs", 1}, {"echo", true}, {"temperature", 0},
                        {"kvevict", h2o}});
    requests.push_back({{"prompt", prompts}, {"max_tokens", 1}, {"logprobs", 1}, {"echo", true}, {"temperature", 0}});
  }
  requests.push_back({{"prompt", "Once upon a time there was a girl named Lily"}, {"max_tokens", 0}, {"logprobs", 3},
                      {"echo", true}, {"kvevict", h2o}});
  const std::vector<std::string> texts = {"Once upon a time", "The cat sat", "One day, a little boy named Tim went"};
  for (size_t t = 0; t < texts.size(); ++t) {
    requests.push_back({{"prompt", texts[t]}, {"max_tokens", 20 + 15 * static_cast<int>(t)}, {"temperature", 0},
                        {"logprobs", 2}, {"kvevict", h2o}});
    requests.push_back({{"prompt", texts[t]}, {"max_tokens", 40}, {"temperature", 0.8}, {"seed", 7 + t},
                        {"stop", json::array({"\n\n"})}});
    requests.push_back({{"prompt", texts[t]}, {"max_tokens", 30 + 10 * static_cast<int>(t)}, {"temperature", 0},
                        {"stream", true}, {"kvevict", h2o}});
  }
  const size_t good = requests.size();
  // A token budget under the policy's sink tokens: refused by the policy on the request's
  // own sequence, once scoring, once generating (the stream's own check, before it joins).
  const json too_few = {{"policy", "streamingllm"}, {"budget_tokens", 2}};
  requests.push_back({{"prompt", json::array({1, 5, 6})}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0},
                      {"kvevict", too_few}});
  requests.push_back({{"prompt", json::array({1, 5, 6})}, {"max_tokens", 5}, {"kvevict", too_few}});

  for (const std::string mode : {"decode", "sim"}) {
    DYNAMIC_SECTION(mode << " mode") {
      // Batch 1, one request at a time: the reference.
      std::vector<std::string> alone;
      {
        ServerProcess server({"--mode", mode, "--batch-size", "1"}, "batch1_" + mode);
        for (const json& body : requests) {
          auto res = server.client().Post("/v1/completions", body.dump(), "application/json");
          REQUIRE(res);
          alone.push_back(comparable_answer(body, res->status, res->body));
        }
        // No batcher at batch size 1: today's path, each request on its worker's thread.
        auto metrics = server.client().Get("/metrics");
        REQUIRE(metrics);
        CHECK(metrics->body.find("kvevict_batch_model_calls_total") == std::string::npos);
      }
      for (size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i << ": " << alone[i].substr(0, 300));
        if (i < good)
          CHECK(alone[i].rfind("4", 0) != 0);
        else
          CHECK(alone[i].rfind("400 ", 0) == 0);
        if (requests[i].value("stream", false)) CHECK(alone[i].rfind("stream chunked ", 0) == 0);
      }
      // Batch 4 with 8 workers: 8 clients send every request at once, each in its own order,
      // so streams join while others run and some wait for a place.
      ServerProcess server({"--mode", mode, "--batch-size", "4", "--workers", "8"}, "batch4_" + mode);
      constexpr int kClients = 8;
      std::vector<std::vector<std::string>> got(kClients, std::vector<std::string>(requests.size()));
      std::vector<std::thread> clients;
      for (int c = 0; c < kClients; ++c)
        clients.emplace_back([&, c] {
          for (size_t k = 0; k < requests.size(); ++k) {
            const size_t n = requests.size(), rotated = (k + static_cast<size_t>(c) * 3) % n;
            const size_t i = c % 2 ? n - 1 - rotated : rotated;
            auto res = server.client().Post("/v1/completions", requests[i].dump(), "application/json");
            got[c][i] = res ? comparable_answer(requests[i], res->status, res->body) : "no answer";
          }
        });
      for (auto& t : clients) t.join();
      for (int c = 0; c < kClients; ++c)
        for (size_t i = 0; i < requests.size(); ++i) {
          INFO("client " << c << " request " << i << ": " << requests[i].dump().substr(0, 200));
          CHECK(got[c][i] == alone[i]);
        }
      // Batching happened: some model call ran several requests' sequences.
      auto metrics = server.client().Get("/metrics");
      REQUIRE(metrics);
      INFO(metrics->body);
      const double calls = metric(metrics->body, "kvevict_batch_model_calls_total");
      CHECK(calls > 0);
      CHECK(metric(metrics->body, "kvevict_batch_sequences_count") == calls);
      CHECK(metric(metrics->body, "kvevict_batch_segments_total") > calls);
      CHECK(metric(metrics->body, "kvevict_batch_sequences_bucket{le=\"1\"}") < calls);
      CHECK(metric(metrics->body, "kvevict_batch_largest") >= 2);
      CHECK(metric(metrics->body, "kvevict_batch_largest") <= 4);
      CHECK(metric(metrics->body, "kvevict_batch_sequences_bucket{le=\"4\"}") == calls);
      CHECK(metric(metrics->body, "kvevict_batch_size_limit") == 4);
      CHECK(metric(metrics->body, "kvevict_batch_running") == 0);
      CHECK(metric(metrics->body, "kvevict_request_errors_total") == 2 * kClients);
    }
  }
}

TEST_CASE("a streaming client that disconnects stops its generation and frees its place", "[server]") {
  for (const std::string batch : {"1", "2"}) {
    DYNAMIC_SECTION("batch size " << batch) {
      ServerProcess server({"--mode", "decode", "--batch-size", batch}, "disconnect_" + batch);
      const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0},
                         {"kvevict", {{"policy", "h2o"}, {"budget", 0.5}}}};
      json whole = post(server, "/v1/completions", body);
      const int full_tokens = whole["usage"]["completion_tokens"].get<int>();
      REQUIRE(full_tokens >= 100);
      // The same request streamed, dropped once its first text has come.
      json streamed = body;
      streamed["stream"] = true;
      httplib::Request request;
      request.method = "POST";
      request.path = "/v1/completions";
      request.body = streamed.dump();
      request.set_header("Content-Type", "application/json");
      std::string received;
      request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
        received.append(data, length);
        return received.find("\"text\":\"") == std::string::npos;  // false: hang up
      };
      auto client = server.client();
      auto res = client.send(request);
      CHECK(!res);  // the client cancelled
      CHECK(received.find("data: ") == 0);
      client.stop();
      // The server counts a request's generated tokens as it ends.
      double generated = 0;
      for (int i = 0; i < 2000 && generated <= full_tokens; ++i) {
        auto metrics = server.client().Get("/metrics");
        REQUIRE(metrics);
        generated = metric(metrics->body, "kvevict_generated_tokens_total");
        if (generated <= full_tokens) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const double dropped = generated - full_tokens;
      CHECK(dropped > 0);
      CHECK(dropped < full_tokens);  // it stopped when the client went, not at max_tokens
      // Its place is free, and nothing of it stays: the next request gets the same answer.
      json again = post(server, "/v1/completions", body);
      for (json* j : {&whole, &again}) {
        j->erase("id");
        j->erase("created");
      }
      CHECK(again == whole);
      if (batch != "1") {
        auto metrics = server.client().Get("/metrics");
        REQUIRE(metrics);
        CHECK(metric(metrics->body, "kvevict_batch_running") == 0);
        CHECK(metric(metrics->body, "kvevict_batch_waiting") == 0);
      }
    }
  }
}

}  // namespace
}  // namespace kvevict
