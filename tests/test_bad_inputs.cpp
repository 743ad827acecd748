// The bad-input suite: every case is a hostile or mistaken input to the CLI. Each must
// end with a non-zero exit (not a signal), exactly one line on stderr that names the
// file, key, flag or tensor at fault, and the files it was given left exactly as they
// were. Cases are grouped by the input they break.
#include <algorithm>
#include "tests/catch.h"
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "notebooks-export/results_csv.h"
#include "tests/pickle_bytes.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A model folder: the real stories260K (or another shared model) with config.json
// patched (RFC 7386 merge patch: null deletes a key) and the weights linked, not copied.
std::string model_dir(const std::string& root, const std::string& name, const json& patch,
                      const std::string& base = "models/stories260K-hf") {
  const std::string dir = root + "/" + name;
  fs::create_directories(dir);
  const std::string source = kvevict::test::data(base);
  json config = kvevict::test::read_json(source + "/config.json");
  config.merge_patch(patch);
  write(dir + "/config.json", config.dump(2));
  for (const char* file : {"model.safetensors", "tokenizer.model"})
    if (fs::exists(source + "/" + file)) fs::create_symlink(source + "/" + file, dir + "/" + file);
  return dir;
}

// A model folder whose model.safetensors is the given header and data bytes.
std::string safetensors_model(const std::string& root, const std::string& name, const std::string& header,
                              size_t data_bytes, int64_t header_length = -1) {
  const std::string dir = root + "/" + name;
  fs::create_directories(dir);
  fs::copy_file(kvevict::test::data("models/stories260K-hf/config.json"), dir + "/config.json");
  std::string bytes(8, '\0');
  const uint64_t length = header_length >= 0 ? static_cast<uint64_t>(header_length) : header.size();
  std::memcpy(&bytes[0], &length, 8);
  write(dir + "/model.safetensors", bytes + header + std::string(data_bytes, '\0'));
  return dir;
}

// Every file under `dir` with its bytes (the folder lock's sidecar excepted).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().filename() == ".kvevict.lock") continue;
    // A link by its target, and the target's bytes too: a write through it changes them.
    const std::string path = entry.path().string();
    std::string& recorded = files[path];
    if (entry.is_symlink()) recorded = "<link to " + fs::read_symlink(entry.path()).string() + "> ";
    recorded += entry.is_regular_file() ? kvevict::test::read_text(path) : "<dir>";
  }
  return files;
}

std::string results_header() { return kvevict::result_header() + "\n"; }
std::string good_row(const std::string& task = "copa") {
  kvevict::ResultRow row;
  row.model = "models/stories260K-hf";
  row.task = task;
  row.policy = "full";
  row.protocol = "stream";
  row.mode = "simulation";
  row.score = "sum";
  row.shots = 0;
  row.seed = 42;
  row.metric = "acc";
  row.value = 0.5;
  row.n = 10;
  return kvevict::format_row(row) + "\n";
}

// The GPT-NeoX tokenizer.json cut to its first 400 tokens (the merges among them kept),
// with its two special tokens (ids 0 and 1, in the vocabulary) and one added token, 24
// spaces, at id 400: a small tokenizer that loads, for models of 401 tokens or more.
const json& small_tokenizer() {
  static const json tokenizer = [] {
    json t = kvevict::test::read_json(kvevict::test::data("tokenizers/gpt-neox-20b/tokenizer.json"));
    json vocab = json::object();
    for (const auto& [token, id] : t["model"]["vocab"].items())
      if (id.get<int>() < 400) vocab[token] = id;
    json merges = json::array();
    for (const auto& merge : t["model"]["merges"]) {
      const std::string text = merge.get<std::string>();
      const std::string left = text.substr(0, text.find(' ')), right = text.substr(text.find(' ') + 1);
      if (vocab.contains(left) && vocab.contains(right) && vocab.contains(left + right)) merges.push_back(merge);
    }
    t["model"]["vocab"] = vocab;
    t["model"]["merges"] = merges;
    t["added_tokens"] = json::array({t["added_tokens"][0], t["added_tokens"][1], t["added_tokens"][2]});
    t["added_tokens"][2]["id"] = 400;
    return t;
  }();
  return tokenizer;
}

// A Sequence [Split REGEX, ByteLevel] pre-tokenizer, as Llama-3 and Qwen have.
json split_pre_tokenizer(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

// A copy of a pytorch_model.bin model folder (config.json and the checkpoint) to damage,
// and the perplexity command that loads it.
std::string bin_model(const std::string& root, const std::string& base = "models/tiny-random-opt-bin") {
  const std::string dir = root + "/m";
  fs::create_directories(dir);
  for (const char* file : {"config.json", "pytorch_model.bin"}) {
    fs::copy_file(kvevict::test::data(base) + "/" + file, dir + "/" + file);
    fs::permissions(dir + "/" + file, fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}
std::string load_command(const std::string& root, const std::string& model) {
  write(root + "/tokens.txt", "2 5 7 9 11");
  return "perplexity --model " + model + " --tokens-file " + root + "/tokens.txt";
}
// Overwrites bytes of a file in place.
void patch(const std::string& path, size_t offset, const std::string& bytes) {
  std::string text = kvevict::test::read_text(path);
  REQUIRE(offset + bytes.size() <= text.size());
  text.replace(offset, bytes.size(), bytes);
  write(path, text);
}
std::string le16(uint16_t v) { return std::string{static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)}; }
std::string le32(uint32_t v) { return le16(static_cast<uint16_t>(v & 0xFFFF)) + le16(static_cast<uint16_t>(v >> 16)); }

// One line of H2O's CNN/DM request file with a short article, `patch` merged in.
std::string cnndm_request(const json& patch) {
  json line = {{"article", "###\nArticle: A cat sat on the mat."}, {"summary_gt", "A cat sat."},
               {"max_tokens", 8}, {"temperature", 0.3}, {"stop", {"###"}}};
  line.merge_patch(patch);
  return line.dump() + "\n";
}

struct Case {
  std::string group, name;
  // Builds the case's files under the folder given and returns the CLI arguments.
  std::function<std::string(const std::string&)> setup;
  std::vector<std::string> expected;  // every one must appear in the error line
};

const std::string kText = "--text-file " + std::string("../shared/data/text/tinystories_sample.txt");

std::vector<Case> cases() {
  std::vector<Case> c;
  auto config_case = [&](const std::string& name, const json& patch, const std::string& key,
                         const std::string& base = "models/stories260K-hf") {
    c.push_back({"config.json", name,
                 [=](const std::string& d) {
                   return "generate --max-new-tokens 1 --model " + model_dir(d, "m", patch, base);
                 },
                 {"config.json", key}});
  };
  // config.json: sizes, types and ranges, before any arithmetic or allocation.
  config_case("zero heads (was SIGFPE)", {{"num_attention_heads", 0}}, "num_attention_heads");
  config_case("2^40 layers (was unbounded memory)", {{"num_hidden_layers", 1099511627776LL}}, "num_hidden_layers");
  config_case("negative hidden size", {{"hidden_size", -16}}, "hidden_size");
  config_case("zero vocabulary", {{"vocab_size", 0}}, "vocab_size");
  config_case("fractional intermediate size", {{"intermediate_size", 1.5}}, "intermediate_size");
  config_case("negative max positions", {{"max_position_embeddings", -1}}, "max_position_embeddings");
  config_case("kv heads not dividing heads", {{"num_key_value_heads", 3}}, "num_key_value_heads");
  config_case("zero kv heads", {{"num_key_value_heads", 0}}, "num_key_value_heads");
  config_case("string rms_norm_eps (was the default)", {{"rms_norm_eps", "x"}}, "rms_norm_eps");
  config_case("negative rms_norm_eps", {{"rms_norm_eps", -1e-5}}, "rms_norm_eps");
  config_case("string rope_theta", {{"rope_theta", "big"}}, "rope_theta");
  config_case("zero rope_theta", {{"rope_theta", 0}}, "rope_theta");
  config_case("string tie_word_embeddings", {{"tie_word_embeddings", "yes"}}, "tie_word_embeddings");
  config_case("bos id outside the vocabulary", {{"bos_token_id", 100000}}, "bos_token_id");
  config_case("string eos id", {{"eos_token_id", "2"}}, "eos_token_id");
  config_case("unsupported hidden_act", {{"hidden_act", "gelu"}}, "hidden_act");
  config_case("numeric hidden_act", {{"hidden_act", 7}}, "hidden_act");
  config_case("unknown model_type", {{"model_type", "bert"}}, "model_type");
  config_case("negative rope_scaling factor", {{"rope_scaling", {{"rope_type", "linear"}, {"factor", -2}}}}, "factor");
  config_case("unimplemented rope_scaling type", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2}}}}, "yarn");
  config_case("head_dim zero", {{"head_dim", 0}}, "head_dim");
  config_case("gpt_neox rotary_pct 7 (was a stack trace)", {{"rotary_pct", 7}}, "rotary_pct", "models/tiny-random-gptneox");
  config_case("gpt_neox rotary_pct -1 (was a stack trace)", {{"rotary_pct", -1}}, "rotary_pct", "models/tiny-random-gptneox");
  config_case("gpt_neox zero heads (was SIGFPE)", {{"num_attention_heads", 0}}, "num_attention_heads", "models/tiny-random-gptneox");
  config_case("opt zero heads (was SIGFPE)", {{"num_attention_heads", 0}}, "num_attention_heads", "models/tiny-random-opt");
  config_case("opt heads not dividing hidden", {{"num_attention_heads", 3}}, "num_attention_heads", "models/tiny-random-opt");
  config_case("opt string do_layer_norm_before", {{"do_layer_norm_before", "no"}}, "do_layer_norm_before", "models/tiny-random-opt");
  config_case("phi3 partial_rotary_factor 2", {{"partial_rotary_factor", 2}}, "partial_rotary_factor", "models/tiny-random-phi3");
  // DMC (docs/DMC.md): a property of LLaMA-family models, two keys, checked before any weight is read.
  const json dmc_keys = {{"dmc_window_size", 12}, {"dmc_init_val", 5.0}};
  config_case("opt with dmc_window_size", dmc_keys, "dmc_window_size", "models/tiny-random-opt");
  config_case("gpt_neox with dmc_init_val", {{"dmc_init_val", 5.0}}, "dmc_init_val", "models/tiny-random-gptneox");
  config_case("dmc_window_size 0", {{"dmc_window_size", 0}}, "dmc_window_size", "models/tiny-random-llama-dmc");
  config_case("dmc_window_size 2.5", {{"dmc_window_size", 2.5}}, "dmc_window_size", "models/tiny-random-llama-dmc");
  config_case("dmc_init_val \"NaN\"", {{"dmc_init_val", "NaN"}}, "dmc_init_val", "models/tiny-random-llama-dmc");
  config_case("dmc_window_size without dmc_init_val", {{"dmc_init_val", nullptr}}, "dmc_init_val", "models/tiny-random-llama-dmc");
  config_case("DMC with head_dim 1", {{"head_dim", 1}}, "head_dim", "models/tiny-random-llama-dmc");
  config_case("qwen3 with DMC keys", dmc_keys, "dmc_window_size", "models/tiny-random-qwen3");
  c.push_back({"config.json", "dmc_init_val NaN as Python writes it",
               [](const std::string& d) {
                 const std::string m = model_dir(d, "m", json::object(), "models/tiny-random-llama-dmc");
                 std::string text = kvevict::test::read_text(m + "/config.json");
                 const std::string from = "\"dmc_init_val\": 5.0";
                 text.replace(text.find(from), from.size(), "\"dmc_init_val\": NaN");
                 fs::remove(m + "/config.json");
                 write(m + "/config.json", text);
                 return "generate --max-new-tokens 1 --model " + m;
               },
               {"config.json", "malformed JSON", "dmc_init_val"}});
  c.push_back({"config.json", "config.json not JSON",
               [](const std::string& d) {
                 const std::string m = model_dir(d, "m", json::object());
                 fs::remove(m + "/config.json");
                 write(m + "/config.json", "{\"model_type\": \"llama\",");
                 return "generate --model " + m;
               },
               {"config.json", "malformed JSON"}});
  c.push_back({"config.json", "config.json is a folder",
               [](const std::string& d) {
                 const std::string m = model_dir(d, "m", json::object());
                 fs::remove(m + "/config.json");
                 fs::create_directories(m + "/config.json");
                 return "generate --model " + m;
               },
               {"config.json"}});
  c.push_back({"tokenizer", "tokenizer larger than the model's vocabulary",
               [](const std::string& d) {
                 const std::string m = d + "/small";
                 kvevict::test::run_kvevict("make-random-model --out " + m +
                                            " --layers 1 --hidden 16 --heads 2 --kv-heads 2 --intermediate 8 --vocab 100");
                 fs::copy_file(kvevict::test::data("models/stories260K-hf/tokenizer.model"), m + "/tokenizer.model");
                 return "generate --max-new-tokens 1 --model " + m;
               },
               {"tokenizer", "512", "vocab_size is 100"}});
  // Found by fuzz_bpe_json: a number where tokenizer.json has a boolean flag threw nlohmann's
  // type_error (an abort in the fuzzer; a message without the file name from the CLI) before ffa0d96.
  c.push_back({"tokenizer", "tokenizer.json added token with a numeric 'special' (was a JSON-library error)",
               [](const std::string& d) {
                 const std::string m = d + "/bpe";
                 kvevict::test::run_kvevict("make-random-model --out " + m +
                                            " --layers 1 --hidden 16 --heads 2 --kv-heads 2 --intermediate 8 --vocab 100");
                 json tokenizer = kvevict::test::read_json(kvevict::test::data("tokenizers/gpt-neox-20b/tokenizer.json"));
                 tokenizer["added_tokens"][0]["special"] = 1;
                 write(m + "/tokenizer.json", tokenizer.dump());
                 return "generate --max-new-tokens 1 --model " + m;
               },
               {"tokenizer.json", "<|endoftext|>", "special", "true or false"}});

  // model.safetensors: offsets, sizes and names.
  auto tensor = [](const std::string& name, const std::string& shape, int64_t begin, int64_t end) {
    return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) +
           "," + std::to_string(end) + "]}";
  };
  auto st_case = [&](const std::string& name, const std::string& header, size_t data, const std::string& key,
                     int64_t header_length = -1) {
    c.push_back({"safetensors", name,
                 [=](const std::string& d) {
                   return "generate --model " + safetensors_model(d, "m", header, data, header_length);
                 },
                 {"model.safetensors", key}});
  };
  st_case("overlapping data_offsets", "{" + tensor("a", "[4]", 0, 16) + "," + tensor("b", "[4]", 8, 24) + "}", 24, "overlap");
  st_case("duplicate tensor name", "{" + tensor("a", "[4]", 0, 16) + "," + tensor("a", "[4]", 16, 32) + "}", 32, "twice");
  st_case("offsets past the end", "{" + tensor("a", "[4]", 0, 16) + "}", 8, "run past");
  st_case("shape size overflows (was 'needs 0 bytes')", "{" + tensor("a", "[4294967296,4294967296]", 0, 16) + "}", 16, "overflows");
  st_case("negative shape", "{" + tensor("a", "[-4]", 0, 16) + "}", 16, "negative");
  st_case("gap between tensors", "{" + tensor("a", "[4]", 0, 16) + "," + tensor("b", "[4]", 32, 48) + "}", 48, "gap");
  st_case("bytes after the last tensor", "{" + tensor("a", "[4]", 0, 16) + "}", 32, "data bytes");
  st_case("shape and offsets disagree", "{" + tensor("a", "[5]", 0, 16) + "}", 16, "needs 20 bytes");
  st_case("header length past the file", "{}", 0, "header length", 1 << 20);
  st_case("header not JSON", "{\"a\":", 0, "malformed");
  // Found by fuzz_safetensors: the JSON library cast these to integers, undefined behaviour.
  st_case("data_offsets beyond 64 bits (was a cast of 1e57)",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8888888888888888888888888888888888]}}", 16,
          "data_offsets");
  st_case("fractional shape (was read as 4)",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[4.5],\"data_offsets\":[0,16]}}", 16, "4.5");
  c.push_back({"safetensors", "file shorter than 8 bytes",
               [](const std::string& d) {
                 const std::string m = safetensors_model(d, "m", "{}", 0);
                 write(m + "/model.safetensors", "abc");
                 return "generate --model " + m;
               },
               {"model.safetensors", "truncated"}});
  c.push_back({"safetensors", "index naming a missing shard",
               [](const std::string& d) {
                 const std::string m = safetensors_model(d, "m", "{}", 0);
                 fs::remove(m + "/model.safetensors");
                 write(m + "/model.safetensors.index.json", R"({"weight_map": {"a": "model-00001.safetensors"}})");
                 return "generate --model " + m;
               },
               {"model.safetensors.index.json", "model-00001.safetensors"}});
  c.push_back({"safetensors", "index pointing outside the folder",
               [](const std::string& d) {
                 const std::string m = safetensors_model(d, "m", "{}", 0);
                 fs::remove(m + "/model.safetensors");
                 write(m + "/model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
                 return "generate --model " + m;
               },
               {"model.safetensors.index.json", "../x.safetensors"}});

  // make-random-model: every size checked before anything is written.
  auto random_case = [&](const std::string& name, const std::string& flags, const std::string& key) {
    c.push_back({"make-random-model", name,
                 [=](const std::string& d) { return "make-random-model --out " + d + "/r " + flags; },
                 {key}});
  };
  random_case("zero heads (was SIGFPE)", "--heads 0", "--heads");
  random_case("negative hidden (was a stack trace and a partial file)", "--hidden -16", "--hidden");
  random_case("zero layers", "--layers 0", "--layers");
  random_case("2^40 layers", "--layers 1099511627776", "--layers");
  random_case("kv heads not dividing heads", "--heads 4 --kv-heads 3 --hidden 64", "kv-heads");
  random_case("zero vocabulary", "--vocab 0", "--vocab");
  random_case("odd head width", "--hidden 12 --heads 4 --kv-heads 4", "head width");
  c.push_back({"make-random-model", "--out is a file",
               [](const std::string& d) {
                 write(d + "/file", "x");
                 return "make-random-model --out " + d + "/file --layers 1 --hidden 16 --heads 2 --kv-heads 2";
               },
               {"--out", "file"}});

  // CLI numbers, enums and exclusive flags.
  auto cli_case = [&](const std::string& name, const std::string& args, const std::string& key) {
    c.push_back({"flags", name, [=](const std::string&) { return args; }, {key}});
  };
  const std::string gen = "generate --max-new-tokens 2 ";
  cli_case("--max-new-tokens 0", "generate --max-new-tokens 0", "--max-new-tokens");
  cli_case("--temperature nan", gen + "--temperature nan", "--temperature");
  cli_case("--temperature -1", gen + "--temperature -1", "--temperature");
  c.push_back({"flags", "--budget nan (was no budget)", [=](const std::string&) { return gen + "--policy h2o --budget nan"; }, {"--budget", "nan"}});
  cli_case("--budget -1 (was no budget)", gen + "--policy full --budget -1", "--budget");
  cli_case("--budget 1.5", gen + "--policy h2o --budget 1.5", "--budget");
  cli_case("eval --batch-size 0", "eval --task copa --limit 1 --batch-size 0", "--batch-size");
  cli_case("serve --batch-size 0", "serve --port 0 --batch-size 0", "--batch-size");
  cli_case("serve --workers 0 (0 is the default's stand-in, not a value)", "serve --port 0 --workers 0", "--workers");
  cli_case("serve --workers 100000", "serve --port 0 --workers 100000", "--workers");
  cli_case("serve --max-queue 100000 (was a thread per slot made at start)", "serve --port 0 --max-queue 100000",
           "--max-queue");
  cli_case("serve --max-connections 0", "serve --port 0 --max-connections 0", "--max-connections");
  cli_case("serve --request-timeout 0", "serve --port 0 --request-timeout 0", "--request-timeout");
  cli_case("--threads 100000 (was a hang)", "serve --port 0 --threads 100000", "--threads");
  cli_case("serve --api-key '' (was no authentication)", "serve --port 0 --api-key ''", "--api-key");
  cli_case("serve --policy full --heavy-share 0.3 (was ignored)", "serve --port 0 --policy full --heavy-share 0.3",
           "--heavy-share");
  cli_case("serve --policy h2o --budget 0.5 --n-sink 2 (was ignored)", "serve --port 0 --policy h2o --budget 0.5 --n-sink 2",
           "--n-sink");
  c.push_back({"flags", "serve --port-file a folder (was SIGABRT after loading)",
               [](const std::string& dir) { return "serve --port 0 --port-file " + dir; }, {"--port-file"}});
  cli_case("serve --port-file under /proc (was SIGABRT after loading)", "serve --port 0 --port-file /proc/kvevict_port",
           "--port-file");
  c.push_back({"flags", "serve --port-file a sweep's results.csv (was replaced)",
               [](const std::string& dir) {
                 fs::create_directories(dir + "/sweep");
                 std::ofstream(dir + "/sweep/results.csv") << "model,task\n";
                 std::ofstream(dir + "/sweep/.kvevict.lock");
                 return "serve --port 0 --port-file " + dir + "/sweep/results.csv";
               },
               {"--port-file", "results.csv"}});
  c.push_back({"flags", "serve --port-file the model's config.json (was replaced)",
               [](const std::string& dir) {
                 fs::copy(kvevict::test::data("models/stories260K-hf"), dir + "/model");
                 return "serve --port 0 --model " + dir + "/model --port-file " + dir + "/model/config.json";
               },
               {"--port-file", "config.json"}});
  c.push_back({"flags", "serve --port-file a link to the model's tokenizer.model (was written through)",
               [](const std::string& dir) {
                 fs::copy(kvevict::test::data("models/stories260K-hf"), dir + "/model");
                 fs::create_symlink(dir + "/model/tokenizer.model", dir + "/port");
                 return "serve --port 0 --model " + dir + "/model --port-file " + dir + "/port";
               },
               {"--port-file", "tokenizer.model"}});
  cli_case("--budget with --budget-tokens (was the tokens)", gen + "--policy h2o --budget 0.5 --budget-tokens 4", "--budget-tokens");
  cli_case("--budget-tokens 0", gen + "--policy h2o --budget-tokens 0", "--budget-tokens");
  cli_case("--kernel 0 (was no pooling)", gen + "--policy snapkv --budget 0.5 --kernel 0", "--kernel");
  cli_case("--kernel -3", gen + "--policy snapkv --budget 0.5 --kernel -3", "--kernel");
  cli_case("--kernel 4 (even: no centre)", gen + "--policy snapkv --budget 0.5 --kernel 4", "--kernel");
  cli_case("--group-reduce sum (was mean)", gen + "--policy h2o --budget 0.5 --group-reduce sum", "--group-reduce");
  cli_case("--pooling median", gen + "--policy snapkv --budget 0.5 --pooling median", "--pooling");
  cli_case("--n-sink -4", gen + "--policy streamingllm --budget 0.5 --n-sink -4", "--n-sink");
  cli_case("--heavy-ratio -0.1", gen + "--policy h2o-paper --heavy-ratio -0.1 --recent-ratio 0.1", "--heavy-ratio");
  cli_case("--heavy-share 2", gen + "--policy h2o --budget 0.5 --heavy-share 2", "--heavy-share");
  cli_case("--window 0", gen + "--policy snapkv --budget 0.5 --window 0", "--window");
  cli_case("--summary -1", gen + "--policy sparse-fixed --budget 0.5 --summary -1", "--summary");
  cli_case("--n-future-positions 0", gen + "--policy expected-attention --budget 0.5 --n-future-positions 0",
           "--n-future-positions");
  cli_case("--use-covariance yes", gen + "--policy expected-attention --budget 0.5 --use-covariance yes", "--use-covariance");
  cli_case("--epsilon -1", gen + "--policy expected-attention --budget 0.5 --epsilon -1", "--epsilon");
  cli_case("unknown policy", gen + "--policy lru --budget 0.5", "lru");
  cli_case("critical+tova (its heads share one decision)", gen + "--policy critical+tova --budget 0.5", "critical+tova");
  cli_case("--first-stage-ratio 2", gen + "--policy critical+snapkv --budget 0.5 --first-stage-ratio 2",
           "--first-stage-ratio");
  cli_case("duo-attention without --pattern-file", gen + "--policy duo-attention --budget 0.5", "--pattern-file");
  cli_case("--pattern-file missing",
           gen + "--policy duo-attention --budget 0.5 --pattern-file /nonexistent/heads.tsv", "/nonexistent/heads.tsv");
  c.push_back({"flags", "--pattern-file of another model's shape",
               [=](const std::string& d) {
                 write(d + "/heads.tsv", "0.1\t0.2\n");
                 return gen + "--policy duo-attention --budget 0.5 --pattern-file " + d + "/heads.tsv";
               },
               {"heads.tsv", "1 layers x 2 KV heads"}});
  // KIVI (harness/common/kv_quant.h); stories260K's head_dim is 8.
  cli_case("--kv-bits 3", gen + "--kv-quant kivi --kv-bits 3", "--kv-bits");
  cli_case("--kv-bits 8 (not implemented)", gen + "--kv-quant kivi --kv-bits 8", "--kv-bits");
  cli_case("--kv-quant int8", gen + "--kv-quant int8", "--kv-quant");
  cli_case("--kv-group 3 not dividing head_dim 8", gen + "--kv-quant kivi --kv-group 3 --kv-residual 6", "--kv-group 3 does not divide");
  cli_case("--kv-residual not a multiple of --kv-group", gen + "--kv-quant kivi --kv-group 8 --kv-residual 12", "--kv-residual");
  cli_case("--kv-memory 0", gen + "--policy h2o --kv-memory 0", "--kv-memory");
  cli_case("--kv-memory 1.5", gen + "--policy h2o --kv-memory 1.5", "--kv-memory");
  cli_case("--kv-memory keeping no token", gen + "--policy h2o --kv-quant kivi --kv-group 8 --kv-residual 16 --kv-memory 0.01",
           "keeps no token");
  cli_case("--kv-memory with --budget", gen + "--policy h2o --budget 0.5 --kv-memory 0.5", "--kv-memory");
  cli_case("sim-only policy with KIVI", "perplexity --policy h2o-paper --budget 0.5 --kv-quant kivi --kv-group 8 --kv-residual 16 " + kText + " --max-tokens 20",
           "is sim-only");
  cli_case("perplexity --max-tokens 0 (was all)", "perplexity " + kText + " --max-tokens 0", "--max-tokens");
  cli_case("perplexity --prefill -3", "perplexity " + kText + " --prefill -3", "--prefill");
  cli_case("perplexity --mode fast", "perplexity " + kText + " --mode fast", "fast");
  cli_case("eval --max-length -4 (was a vector max_size error)", "eval --task copa --limit 2 --max-length -4", "--max-length");
  cli_case("eval --shots -1", "eval --task copa --limit 2 --shots -1", "--shots");
  cli_case("eval --format xml", "eval --task copa --limit 2 --format xml", "--format");
  cli_case("eval unknown task", "eval --task boolq --limit 2", "boolq");
  cli_case("bench --repeat 0", "bench --repeat 0", "--repeat");
  cli_case("bench --batch-size 8 without a batch config (was batch 1, silently)", "bench --batch-size 8", "--batch-size");
  cli_case("bench --batch-size 8 with a policy config", "bench --batch-size 8 --config configs/bench_decode.json",
           "--batch-size");
  cli_case("unknown flag", "generate --bogus 3", "--bogus");
  // A ratio that keeps 0 tokens at any length a model may have, or at this model's whole
  // context (stories260K: 512 positions), never keeps a token; the smallest that does is named.
  c.push_back({"flags", "--budget 1e-9 (was 0 tokens kept)", [=](const std::string&) { return gen + "--policy h2o --budget 1e-9"; },
               {"--budget", "keeps 0 tokens", "5.97e-08"}});
  c.push_back({"flags", "--budget 0.001 on a 512-position model", [=](const std::string&) { return gen + "--policy h2o --budget 0.001"; },
               {"--budget", "512", "0.00196"}});
  c.push_back({"flags", "eval --budget 0.001 on a 512-position model",
               [](const std::string&) { return "eval --task copa --limit 2 --policy h2o --budget 0.001"; },
               {"--budget", "512", "0.00196"}});
  c.push_back({"flags", "perplexity --heavy-ratio/--recent-ratio 0.001 on a 512-position model",
               [](const std::string&) {
                 return "perplexity " + kText + " --max-tokens 64 --policy h2o-paper --heavy-ratio 0.001 --recent-ratio 0.001";
               },
               {"--heavy-ratio", "--recent-ratio", "512"}});
  cli_case("eval --limit 0 (was accuracy 0 over n = 0)", "eval --task copa --limit 0", "limit");
  cli_case("eval --limit -5 (was all)", "eval --task copa --limit -5", "limit");
  cli_case("--dtype int8", gen + "--dtype int8", "int8");
  cli_case("--device tpu", gen + "--device tpu", "tpu");

  // Files given on the command line.
  c.push_back({"files", "--text-file is a folder (was basic_filebuf::underflow)",
               [](const std::string& d) {
                 fs::create_directories(d + "/folder");
                 return "perplexity --text-file " + d + "/folder";
               },
               {"folder"}});
  c.push_back({"files", "--tokens-file with a word",
               [](const std::string& d) {
                 write(d + "/tokens.txt", "1 2 3\n4 five 6\n");
                 return "perplexity --tokens-file " + d + "/tokens.txt";
               },
               {"tokens.txt:2"}});
  c.push_back({"files", "rouge --jsonl with a bad line",
               [](const std::string& d) {
                 write(d + "/p.jsonl", "{\"reference\": \"a\", \"prediction\": \"a\"}\n{\"reference\": 3\n");
                 return "rouge --jsonl " + d + "/p.jsonl";
               },
               {"p.jsonl:2"}});

  c.push_back({"files", "an empty task split (was accuracy 0 over n = 0)",
               [](const std::string& d) {
                 write(d + "/data/copa/val.jsonl", "");
                 return "--data-dir " + d + "/data eval --task copa --model " + kvevict::test::data("models/stories260K-hf");
               },
               {"copa", "no documents"}});

  // Sweep configs.
  auto sweep_case = [&](const std::string& name, const json& patch, const std::string& key) {
    c.push_back({"sweep config", name,
                 [=](const std::string& d) {
                   json config = {{"tasks", {"copa"}}, {"policies", {"full", "h2o"}}, {"budgets", {0.5}}, {"limit", 2}};
                   config.merge_patch(patch);
                   write(d + "/sweep.json", config.dump());
                   return "sweep " + d + "/sweep.json --out " + d + "/out";
                 },
                 {"sweep.json", key}});
  };
  sweep_case("misspelled policy_options key (was ignored)", {{"policy_options", {{"kernal", 5}}}}, "kernal");
  sweep_case("string policy_options value", {{"policy_options", {{"kernel", "5"}}}}, "policy_options.kernel");
  sweep_case("even kernel in policy_options", {{"policy_options", {{"kernel", 4}}}}, "--kernel");
  sweep_case("policy_options not an object", {{"policy_options", 3}}, "policy_options");
  sweep_case("budget above 1", {{"budgets", {1.5}}}, "budget");
  sweep_case("zero budget_tokens", {{"budget_tokens", {0}}}, "budget_tokens");
  sweep_case("unknown top-level key", {{"budgetz", {0.5}}}, "budgetz");
  sweep_case("mode of the wrong type (was a bare JSON error)", {{"mode", 5}}, "wrong type");
  sweep_case("limit of the wrong type", {{"limit", {{"copa", "x"}}}}, "wrong type");
  sweep_case("predictions not true/false (was a JSON-library error after the folder was made)",
             {{"predictions", "yes"}}, "\"predictions\"");
  sweep_case("greedy not true/false", {{"greedy", 1}}, "\"greedy\"");
  sweep_case("bos not true/false", {{"bos", "x"}}, "\"bos\"");
  sweep_case("limit 0 (was a failed cell per policy)", {{"limit", 0}}, "\"limit\"");
  // JSON numbers used to convert to int silently (found by fuzz_sweep_config).
  sweep_case("max_length 2.2e45 (was undefined behaviour)", {{"max_length", 2.2e45}}, "max_length");
  sweep_case("seed -1 (was accepted)", {{"seeds", {-1}}}, "\"seeds\"");
  sweep_case("seed 1e23 (was accepted)", {{"seeds", {1e23}}}, "\"seeds\"");
  sweep_case("shots 2.5 (was 2)", {{"shots", {2.5}}}, "shots");
  sweep_case("limit 2.5 for one task (was 2)", {{"limit", {{"copa", 2.5}}}}, "limit.copa");
  sweep_case("budget 1e-9 (was 0 tokens kept)", {{"budgets", {1e-9}}}, "5.97e-08");
  sweep_case("budget 0.001 on a 512-position model", {{"budgets", {0.001}}}, "0.00196");
  c.push_back({"sweep config", "misspelled key in the slurm block",
               [](const std::string& d) {
                 write(d + "/sweep.json", R"({"tasks": ["copa"], "limit": 2, "slurm": {"partiton": "gpu"}})");
                 return "sweep " + d + "/sweep.json --out " + d + "/out --slurm --dry-run";
               },
               {"sweep.json", "\"slurm.partiton\""}});

  // Bench and analyze configs: every key is declared, so a typo is refused, not ignored.
  auto config_file_case = [&](const std::string& group, const std::string& name, const std::string& file,
                         const std::string& text, const std::string& args, const std::string& key) {
    c.push_back({group, name,
                 [=](const std::string& d) {
                   write(d + "/" + file, text);
                   return args + " " + d + "/" + file + (group == "analyze config" ? " --out " + d + "/out" : "");
                 },
                 {file, key}});
  };
  config_file_case("bench config", "unknown key (was ignored: the default was benched)", "bench.json",
              R"({"sim_policies": ["h2o"], "decode_policy": "h2o", "decode_step": 8})", "bench --config",
              "\"decode_step\"");
  config_file_case("bench config", "tokens of the wrong type (was a JSON-library error)", "bench.json",
              R"({"sim_policies": ["h2o"], "decode_policy": "h2o", "tokens": "many"})", "bench --config",
              "\"tokens\"");
  config_file_case("bench config", "tokenizer benchmark: unknown key", "bench.json",
              R"({"jsonl": "xsum/xsum_test_1000.jsonl", "tokenizers": {"gpt2": "tokenizers/gpt2"}, "limt": 5})",
              "bench --config", "\"limt\"");
  config_file_case("analyze config", "unknown key in an entry (was ignored)", "sweep.json",
              R"({"tasks": ["copa"], "analyze": [{"name": "a", "text_file": "text/tinystories_sample.txt"},
                                                {"name": "b", "task": "copa", "max_token": 5}]})",
              "analyze --config", "\"max_token\"");
  config_file_case("analyze config", "recall_budgets not a list (was not named)", "sweep.json",
              R"({"tasks": ["copa"], "analyze": [{"name": "a", "task": "copa", "recall_budgets": "0.2"}]})",
              "analyze --config", "\"recall_budgets\"");
  c.push_back({"sweep config", "config not JSON",
               [](const std::string& d) {
                 write(d + "/sweep.json", "{\"tasks\": [\"copa\"");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"sweep.json", "malformed JSON"}});

  // Output folders and results files: checked before any cell runs, never rewritten.
  const std::string sweep_json = R"({"tasks": ["copa"], "policies": ["full"], "limit": 2})";
  c.push_back({"output folder", "--out is a file",
               [=](const std::string& d) {
                 write(d + "/sweep.json", sweep_json);
                 write(d + "/out", "not a folder");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"--out", "out"}});
  c.push_back({"output folder", "results.csv without config.json (was mixed into)",
               [=](const std::string& d) {
                 write(d + "/sweep.json", sweep_json);
                 write(d + "/out/results.csv", results_header() + good_row());
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"config.json"}});
  c.push_back({"output folder", "results.csv is a folder (was found after all cells)",
               [=](const std::string& d) {
                 write(d + "/sweep.json", sweep_json);
                 fs::create_directories(d + "/out/results.csv");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"results.csv"}});
  c.push_back({"results.csv", "table: a stray quote mid-file (was a torn last line)",
               [](const std::string& d) {
                 write(d + "/r/results.csv", results_header() + good_row() + "\"copa,full\n" + good_row() + good_row());
                 write(d + "/r/config.json", "{}");
                 return "table " + d + "/r";
               },
               {"results.csv:3"}});
  c.push_back({"results.csv", "table: a short line with its newline at the end",
               [](const std::string& d) {
                 write(d + "/r/results.csv", results_header() + good_row() + "copa,full\n");
                 return "table " + d + "/r";
               },
               {"results.csv:3", "fields"}});
  c.push_back({"results.csv", "table: a wrong header",
               [](const std::string& d) {
                 write(d + "/r/results.csv", "model,task\n" + good_row());
                 return "table " + d + "/r";
               },
               {"results.csv:1"}});
  c.push_back({"results.csv", "table: a bad number",
               [](const std::string& d) {
                 std::string row = good_row();
                 row.replace(row.find(",0.5,"), 5, ",0.5x,");
                 write(d + "/r/results.csv", results_header() + row);
                 return "table " + d + "/r";
               },
               {"results.csv:2", "value"}});
  c.push_back({"results.csv", "table --metric bleu (was an empty table)",
               [](const std::string& d) {
                 write(d + "/r/results.csv", results_header() + good_row());
                 return "table " + d + "/r --metric bleu --out " + d + "/t";
               },
               {"--metric", "bleu"}});
  c.push_back({"results.csv", "table --out in a missing /proc folder (was 'wrote')",
               [](const std::string& d) {
                 write(d + "/r/results.csv", results_header() + good_row());
                 return "table " + d + "/r --out /proc/x/t";
               },
               {"/proc/x/t"}});
  c.push_back({"results.csv", "table: results.csv is a folder",
               [](const std::string& d) {
                 fs::create_directories(d + "/r/results.csv");
                 return "table " + d + "/r";
               },
               {"results.csv"}});
  c.push_back({"results.csv", "merge: a malformed shard line",
               [](const std::string& d) {
                 write(d + "/s0/config.json", R"({"config": {"tasks": ["copa"]}, "shard": [0, 1]})");
                 write(d + "/s0/results.csv", results_header() + "copa,\"x\n" + good_row());
                 return "merge " + d + "/s0 --out " + d + "/merged";
               },
               {"results.csv:2"}});
  c.push_back({"results.csv", "export: a malformed line",
               [](const std::string& d) {
                 write(d + "/r/results.csv", results_header() + good_row() + "a,b\n" + good_row());
                 return "export " + d + "/r --svg " + d + "/svg";
               },
               {"results.csv:3"}});

  // tokenizer.json: ids read strictly and checked as Hugging Face's tokenizers assigns them;
  // the Split regex bounded. The model (tiny-random-llama3) has 512 tokens, the tokenizer 401.
  auto tokenizer_case = [&](const std::string& name, std::function<void(json&)> mutate,
                            std::vector<std::string> expected, const std::string& prompt = "the cat") {
    c.push_back({"tokenizer.json", name,
                 [=](const std::string& d) {
                   const std::string m = model_dir(d, "m", json::object(), "models/tiny-random-llama3");
                   json tokenizer = small_tokenizer();
                   mutate(tokenizer);
                   write(m + "/tokenizer.json", tokenizer.dump());
                   return "generate --max-new-tokens 1 --prompt '" + prompt + "' --model " + m;
                 },
                 expected});
  };
  tokenizer_case("added id 2^31 (was a segfault)", [](json& t) { t["added_tokens"][2]["id"] = 2147483648LL; },
                 {"tokenizer.json", "added_tokens[2]", "2147483648"});
  tokenizer_case("added id 10^12 (was a segfault)", [](json& t) { t["added_tokens"][2]["id"] = 1000000000000LL; },
                 {"tokenizer.json", "added_tokens[2]", "1000000000000"});
  tokenizer_case("added id 2^32 + 5 (was read as 5)", [](json& t) { t["added_tokens"][2]["id"] = 4294967301LL; },
                 {"tokenizer.json", "added_tokens[2]", "4294967301"});
  tokenizer_case("added id 1.5", [](json& t) { t["added_tokens"][2]["id"] = 1.5; },
                 {"tokenizer.json", "added_tokens[2]", "1.5"});
  tokenizer_case("Split regex (a+)+$|(\\s*)*x on 40 a and ! (was unbounded)",
                 [](json& t) { t["pre_tokenizer"] = split_pre_tokenizer("(a+)+$|(\\s*)*x"); },
                 {"tokenizer.json", "Split", "limit"}, std::string(40, 'a') + "!");
  tokenizer_case("empty Split regex (was accepted)", [](json& t) { t["pre_tokenizer"] = split_pre_tokenizer(""); },
                 {"tokenizer.json", "Split", "empty"});
  tokenizer_case("one added content under two ids (was accepted)",
                 [](json& t) {
                   json twin = t["added_tokens"][2];
                   twin["id"] = 401;
                   t["added_tokens"].push_back(twin);
                 },
                 {"tokenizer.json", "added_tokens[3]", "400"});
  tokenizer_case("one added id with two contents (was accepted)",
                 [](json& t) {
                   json other = t["added_tokens"][2];
                   other["content"] = "<|other|>";
                   t["added_tokens"].push_back(other);
                 },
                 {"tokenizer.json", "added_tokens[3]", "<|other|>", "added_tokens[2]"});
  tokenizer_case("empty added content (was accepted)", [](json& t) { t["added_tokens"][2]["content"] = ""; },
                 {"tokenizer.json", "added_tokens[2]", "empty"});
  tokenizer_case("added token on another token's vocabulary id (was accepted)",
                 [](json& t) { t["added_tokens"][2]["id"] = 300; },
                 {"tokenizer.json", "added_tokens[2]", "id 300", "vocabulary token"});
  tokenizer_case("two vocabulary tokens with one id (was accepted)",
                 [](json& t) { t["model"]["vocab"]["!"] = t["model"]["vocab"]["\""]; },
                 {"tokenizer.json", "model.vocab", "both have id 3"});
  tokenizer_case("a vocabulary id past the tokens (was a 2^31-entry table)",
                 [](json& t) { t["model"]["vocab"]["!"] = 2147483000; },
                 {"tokenizer.json", "model.vocab", "2147483000", "[0, 401)"});

  // pytorch_model.bin: the pickle reader's work and nesting bounded, clear messages.
  c.push_back({"pytorch_model.bin", "200k nested lists (was minutes, superlinear)",
               [](const std::string& d) {
                 const std::string m = bin_model(d, "models/tiny-random-opt-bin-legacy");
                 write(m + "/pytorch_model.bin", kvevict::test::pickle_bytes::legacy_header() + "\x80\x02" +
                                                     std::string(200000, ']') + std::string(199999, 'a') + ".");
                 return load_command(d, m);
               },
               {"pytorch_model.bin", "1000 levels"}});
  c.push_back({"pytorch_model.bin", "shape [2^62, 2^62] (was 'reaches element 0')",
               [](const std::string& d) {
                 using namespace kvevict::test::pickle_bytes;
                 const std::string m = bin_model(d);
                 const int64_t big = int64_t{1} << 62;
                 Bytes pickle = "\x80\x02" + kOrderedDict + "(" + str("w") + "ctorch._utils\n_rebuild_tensor_v2\n(";
                 pickle += "(" + str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu") + integer(2) + "tQ";
                 pickle += integer(0) + "(" + long8(big) + long8(big) + "t(" + long8(big) + integer(1) + "t\x89" +
                           kOrderedDict + "tRu.";
                 write(m + "/pytorch_model.bin",
                       write_zip({{"archive/data.pkl", pickle}, {"archive/data/0", floats({1, 2})}}, false));
                 return load_command(d, m);
               },
               {"pytorch_model.bin", "tensor w", "overflows"}});
  c.push_back({"pytorch_model.bin", "legacy file with a damaged magic number (was 'memo entry ... never stored')",
               [](const std::string& d) {
                 const std::string m = bin_model(d, "models/tiny-random-opt-bin-legacy");
                 patch(m + "/pytorch_model.bin", 3, "\x06");  // LONG1's length: the magic's bytes become opcodes
                 return load_command(d, m);
               },
               {"pytorch_model.bin", "magic number"}});
  c.push_back({"pytorch_model.bin", "pytorch_model.bin is a folder (was 'mmap failed: No such device')",
               [](const std::string& d) {
                 const std::string m = bin_model(d);
                 fs::remove(m + "/pytorch_model.bin");
                 fs::create_directories(m + "/pytorch_model.bin");
                 return load_command(d, m);
               },
               {"pytorch_model.bin", "folder"}});

  // The zip container: structure always, data.pkl's CRC always, tensor CRCs by check-model.
  // tiny-random-opt-bin ends with a ZIP64 end record and the 22-byte end record (38 entries).
  auto zip_case = [&](const std::string& name, std::function<void(const std::string&)> damage,
                      std::vector<std::string> expected, bool check_model = false) {
    c.push_back({"zip", name,
                 [=](const std::string& d) {
                   const std::string m = bin_model(d);
                   damage(m + "/pytorch_model.bin");
                   return check_model ? "check-model " + m : load_command(d, m);
                 },
                 expected});
  };
  auto end_record = [](const std::string& file) { return fs::file_size(file) - 22; };
  zip_case("end record entry count 0xFFFF beside a ZIP64 count of 38 (was ignored)",
           [=](const std::string& f) { patch(f, end_record(f) + 8, le16(0xFFFF) + le16(0xFFFF)); },
           {"pytorch_model.bin", "entry count"});
  zip_case("end record entry count 37 of 38 (was ignored)",
           [=](const std::string& f) { patch(f, end_record(f) + 8, le16(37) + le16(37)); },
           {"pytorch_model.bin", "entry count 37"});
  zip_case("central directory offset past the end of the file (was ignored)",
           [=](const std::string& f) { patch(f, end_record(f) + 16, le32(0x7FFFFFF0)); },
           {"pytorch_model.bin", "central directory offset"});
  zip_case("a flipped byte in data.pkl (was loaded)",
           [](const std::string& f) {
             const std::string bytes = kvevict::test::read_text(f);
             patch(f, bytes.find("cpuq") + 2, "v");  // a storage's location "cpu" -> "cpv": still a valid pickle
           },
           {"pytorch_model.bin", "data.pkl", "CRC-32"});
  zip_case("check-model: a flipped byte in a tensor record (was loaded)",
           [](const std::string& f) {
             // The record's local header: 30 bytes, its name, its extra field (padding), then the data.
             const std::string bytes = kvevict::test::read_text(f);
             const size_t name = bytes.find("pytorch_model/data/15"), header = name - 30;
             const size_t data = name + 21 + static_cast<unsigned char>(bytes[header + 28]) +
                                 256 * static_cast<unsigned char>(bytes[header + 29]);
             patch(f, data + 100, std::string(1, static_cast<char>(bytes[data + 100] ^ 0x10)));
           },
           {"pytorch_model.bin", "CRC-32", "pytorch_model/data/15"}, true);
  c.push_back({"zip", "check-model: a tensor shape config.json does not imply",
               [](const std::string& d) {
                 const std::string m = bin_model(d);
                 json config = kvevict::test::read_json(m + "/config.json");
                 config["ffn_dim"] = config["ffn_dim"].get<int>() * 2;
                 write(m + "/config.json", config.dump());
                 return "check-model " + m;
               },
               {"pytorch_model.bin", "fc1.weight", "config.json implies"}});

  // Every JSON file: a key given twice is refused (the JSON library kept the last).
  c.push_back({"duplicate JSON keys", "sweep config with budgets twice (was the last)",
               [](const std::string& d) {
                 write(d + "/sweep.json",
                       R"({"tasks": ["copa"], "policies": ["full", "h2o"], "budgets": [0.5], "budgets": [0.2], "limit": 2})");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"sweep.json", "\"budgets\"", "twice"}});
  c.push_back({"duplicate JSON keys", "a weight_map entry twice (was the last)",
               [](const std::string& d) {
                 const std::string m = d + "/m", base = kvevict::test::data("models/tiny-random-llama-gqa-sharded");
                 fs::create_directories(m);
                 for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
                   fs::create_symlink(base + "/" + f, m + "/" + f);
                 std::string index = kvevict::test::read_text(base + "/model.safetensors.index.json");
                 const std::string entry = "\"lm_head.weight\": \"model-00002-of-00002.safetensors\",";
                 index.replace(index.find(entry), entry.size(), entry + entry);
                 write(m + "/model.safetensors.index.json", index);
                 write(d + "/tokens.txt", "2 5 7");
                 return "perplexity --model " + m + " --tokens-file " + d + "/tokens.txt";
               },
               {"model.safetensors.index.json", "\"lm_head.weight\"", "weight_map"}});
  c.push_back({"duplicate JSON keys", "config.json with hidden_size twice (was the last)",
               [](const std::string& d) {
                 const std::string m = model_dir(d, "m", json::object());
                 std::string config = kvevict::test::read_text(m + "/config.json");
                 config.replace(config.find('{'), 1, "{\"hidden_size\": 64,");
                 fs::remove(m + "/config.json");
                 write(m + "/config.json", config);
                 return "generate --max-new-tokens 1 --model " + m;
               },
               {"config.json", "\"hidden_size\"", "twice"}});
  tokenizer_case("a vocabulary entry twice (was the last)", [](json&) {}, {"tokenizer.json", "\"!\"", "model.vocab"});
  c.back().setup = [](const std::string& d) {
    const std::string m = model_dir(d, "m", json::object(), "models/tiny-random-llama3");
    std::string text = small_tokenizer().dump();
    text.replace(text.find("\"vocab\":{") + 9, 0, "\"!\":2,");
    write(m + "/tokenizer.json", text);
    return "generate --max-new-tokens 1 --prompt 'the cat' --model " + m;
  };
  c.push_back({"duplicate JSON keys", "a task JSONL line with label twice (was the last)",
               [](const std::string& d) {
                 std::string line = kvevict::test::read_text(kvevict::test::data("copa/val.jsonl"));
                 line = line.substr(0, line.find('\n'));
                 line.replace(0, 1, "{\"label\": 0, ");
                 write(d + "/data/copa/val.jsonl", line + "\n");
                 return "--data-dir " + d + "/data eval --task copa --model " + kvevict::test::data("models/stories260K-hf");
               },
               {"val.jsonl:1", "\"label\"", "twice"}});

  // JSON errors in data files: one line naming the file (and line), no library text.
  c.push_back({"data files", "task JSONL: a malformed line (was the JSON library's text)",
               [](const std::string& d) {
                 write(d + "/data/copa/val.jsonl", "{\"premise\": \"broken\n");
                 return "--data-dir " + d + "/data eval --task copa --model " + kvevict::test::data("models/stories260K-hf");
               },
               {"val.jsonl:1", "malformed JSON"}});
  c.push_back({"data files", "mathqa test.json malformed (was the JSON library's text)",
               [](const std::string& d) {
                 write(d + "/data/mathqa/test.json", "[{\"Problem\": ");
                 return "--data-dir " + d + "/data eval --task mathqa --model " + kvevict::test::data("models/stories260K-hf");
               },
               {"test.json", "malformed JSON"}});
  c.push_back({"data files", "mathqa train.json malformed, 1-shot (was the JSON library's text)",
               [](const std::string& d) {
                 fs::create_directories(d + "/data/mathqa");
                 fs::create_symlink(kvevict::test::data("mathqa/test.json"), d + "/data/mathqa/test.json");
                 write(d + "/data/mathqa/train.json", "[{\"Problem\": 1,]");
                 return "--data-dir " + d + "/data eval --task mathqa --shots 1 --limit 1 --model " +
                        kvevict::test::data("models/stories260K-hf");
               },
               {"train.json", "malformed JSON"}});
  c.push_back({"data files", "mathqa_cot: an item without a Rationale (the multiple-choice task never reads it)",
               [](const std::string& d) {
                 write(d + "/data/mathqa/test.json",
                       R"([{"Problem": "p", "options": "a ) 1 , b ) 2 , c ) 3 , d ) 4 , e ) 5", "correct": "a"}])");
                 return "--data-dir " + d + "/data eval --task mathqa_cot --model " + kvevict::test::data("models/stories260K-hf");
               },
               {"test.json", "item 0", "\"Rationale\""}});
  c.push_back({"flags", "mathqa_cot with --pipeline h2o (no prompt file of H2O's for it)",
               [](const std::string& d) {
                 return "--data-dir " + d + "/data eval --task mathqa_cot --pipeline h2o --model " +
                        kvevict::test::data("models/stories260K-hf");
               },
               {"mathqa_cot", "--pipeline h2o", "--pipeline lm-eval"}});
  auto cnndm_case = [&](const std::string& name, const json& patch_line, std::vector<std::string> expected) {
    c.push_back({"data files", name,
                 [=](const std::string& d) {
                   write(d + "/data/cnndm/cnndm_0shot.jsonl", cnndm_request(patch_line));
                   return "--data-dir " + d + "/data eval --task cnndm --pipeline h2o --limit 1 --model " +
                          kvevict::test::data("models/stories260K-hf");
                 },
                 expected});
  };
  cnndm_case("CNN/DM max_tokens 10^12 (was every prediction empty)", {{"max_tokens", 1000000000000LL}},
             {"cnndm_0shot.jsonl:1", "max_tokens", "1000000000000"});
  cnndm_case("CNN/DM stop [\"\"] (was every prediction empty)", {{"stop", {""}}}, {"cnndm_0shot.jsonl:1", "stop"});

  // config.json keys blamed for an odd head width.
  config_case("qwen3 head_dim 7 (blamed partial_rotary_factor)", {{"head_dim", 7}}, "head_dim 7 is odd",
              "models/tiny-random-qwen3");
  config_case("llama 3 heads on hidden 64 (blamed partial_rotary_factor)",
              {{"num_attention_heads", 3}, {"num_key_value_heads", 3}}, "hidden_size 64 / num_attention_heads 3");

  // Outputs (issue 32): no command writes onto a sweep folder's own files; every output is
  // checked before any work starts. R is a finished sweep folder.
  auto sweep_folder = [](const std::string& d) {
    write(d + "/R/results.csv", results_header() + good_row());
    write(d + "/R/config.json", R"({"config": {"tasks": ["copa"]}, "shard": [0, 1]})");
    return d + "/R";
  };
  auto output_case = [&](const std::string& name, std::function<std::string(const std::string&)> args,
                         std::vector<std::string> expected) {
    c.push_back({"outputs", name, [=](const std::string& d) { return args(sweep_folder(d)); }, expected});
  };
  output_case("export --notebook R/results.csv (was overwritten)",
              [](const std::string& r) { return "export " + r + " --notebook " + r + "/results.csv"; },
              {"--notebook", "results.csv", "never overwrites"});
  output_case("export --notebook R/config.json (was overwritten)",
              [](const std::string& r) { return "export " + r + " --notebook " + r + "/config.json"; },
              {"--notebook", "config.json"});
  output_case("export --notebook into a folder (was found after the work)",
              [](const std::string& r) { return "export " + r + " --notebook " + r; }, {"--notebook", "is a folder"});
  output_case("table --out R/results (was R/results.csv overwritten)",
              [](const std::string& r) { return "table " + r + " --out " + r + "/results"; },
              {"--out", "results.csv", "never overwrites"});
  output_case("eval --predictions R/results.csv (was overwritten after the eval)",
              [](const std::string& r) { return "eval --task copa --limit 2 --predictions " + r + "/results.csv"; },
              {"--predictions", "results.csv", "never overwrites"});
  output_case("eval --predictions a folder (was refused only after the whole eval)",
              [](const std::string& r) { return "eval --task copa --limit 2 --predictions " + r; },
              {"--predictions", "is a folder"});
  output_case("eval --predictions in a missing folder",
              [](const std::string& r) { return "eval --task copa --limit 2 --predictions " + r + "/no/p.jsonl"; },
              {"--predictions", "does not exist"});
  output_case("export --svg into a Slurm folder's slurm/",
              [](const std::string& r) {
                write(r + "/slurm/sweep.json", "{}");
                return "export " + r + " --svg " + r + "/slurm";
              },
              {"--svg", "slurm/"});
  output_case("eval --predictions onto a sweep's lock file",
              [](const std::string& r) {
                write(r + "/.kvevict.lock", "");
                return "eval --task copa --limit 2 --predictions " + r + "/.kvevict.lock";
              },
              {"--predictions", ".kvevict.lock"});

  // Outputs (issue 43): no output replaces the command's own inputs (model files, task
  // data, text and token files, sweep configs, shard folders) or lies in a folder it
  // reads, through a symbolic link or not; make-random-model never writes a sweep's files.
  output_case("make-random-model --out a sweep folder (was its config.json replaced)",
              [](const std::string& r) { return "make-random-model --out " + r + " --layers 1 --hidden 16 --heads 2 --kv-heads 2"; },
              {"--out", "config.json", "never overwrites"});
  c.push_back({"outputs", "make-random-model --out its own --tokenizer-from (was its files replaced)",
               [](const std::string& d) {
                 return "make-random-model --out " + model_dir(d, "m", json::object()) + " --tokenizer-from " + d +
                        "/m --layers 1 --hidden 16 --heads 2 --kv-heads 2";
               },
               {"--out", "--tokenizer-from"}});
  c.push_back({"outputs", "eval --predictions onto the model's config.json (was overwritten after the eval)",
               [](const std::string& d) {
                 return "eval --task copa --limit 2 --model " + model_dir(d, "m", json::object()) + " --predictions " + d +
                        "/m/config.json";
               },
               {"--predictions", "config.json", "--model", "never overwrites its inputs"}});
  c.push_back({"outputs", "eval --predictions a link to the model's config.json (was written through)",
               [](const std::string& d) {
                 const std::string m = model_dir(d, "m", json::object());
                 fs::create_symlink(m + "/config.json", d + "/p.jsonl");
                 return "eval --task copa --limit 2 --model " + m + " --predictions " + d + "/p.jsonl";
               },
               {"--predictions", "p.jsonl", "--model"}});
  c.push_back({"outputs", "eval --predictions a new file in the model folder (would change the model)",
               [](const std::string& d) {
                 return "eval --task copa --limit 2 --model " + model_dir(d, "m", json::object()) + " --predictions " + d +
                        "/m/tokenizer.json";
               },
               {"--predictions", "lies in --model"}});
  c.push_back({"outputs", "eval --predictions onto the task's data file (was overwritten)",
               [](const std::string& d) {
                 write(d + "/data/copa/val.jsonl", kvevict::test::read_text(kvevict::test::data("copa/val.jsonl")));
                 return "--data-dir " + d + "/data eval --task copa --limit 2 --model " +
                        kvevict::test::data("models/stories260K-hf") + " --predictions " + d + "/data/copa/val.jsonl";
               },
               {"--predictions", "val.jsonl", "the data folder"}});
  c.push_back({"outputs", "eval --predictions onto the long-context haystack (was overwritten)",
               [](const std::string& d) {
                 write(d + "/data/xsum/xsum_test_1000.jsonl", R"({"document": "A cat.", "summary": "Cat."})" "\n");
                 return "--data-dir " + d + "/data eval --task niah --length 128 --limit 1 --model " +
                        kvevict::test::data("models/stories260K-hf") + " --predictions " + d + "/data/xsum/xsum_test_1000.jsonl";
               },
               {"--predictions", "xsum_test_1000.jsonl", "the data folder"}});
  c.push_back({"outputs", "analyze --out onto its own --tokens-file's folder (was analysis.csv replaced)",
               [](const std::string& d) {
                 write(d + "/o/analysis.csv", "2 5 7 9 11\n");
                 return "analyze --tokens-file " + d + "/o/analysis.csv --out " + d + "/o";
               },
               {"--out", "analysis.csv", "--tokens-file"}});
  c.push_back({"outputs", "analyze --out inside the model folder",
               [](const std::string& d) {
                 return "analyze " + kText + " --model " + model_dir(d, "m", json::object()) + " --out " + d + "/m/a";
               },
               {"--out", "lies in --model"}});
  c.push_back({"outputs", "sweep --out the folder of its own config (was config.json replaced by the record)",
               [](const std::string& d) {
                 write(d + "/S/config.json", R"({"tasks": ["copa"], "policies": ["full"], "limit": 2})");
                 return "sweep " + d + "/S/config.json --out " + d + "/S";
               },
               {"--out", "config.json", "the sweep config"}});
  c.push_back({"outputs", "sweep --out inside the model folder",
               [](const std::string& d) {
                 write(d + "/sweep.json", R"({"tasks": ["copa"], "policies": ["full"], "limit": 2})");
                 return "sweep " + d + "/sweep.json --model " + model_dir(d, "m", json::object()) + " --out " + d + "/m/out";
               },
               {"--out", "lies in the model"}});
  c.push_back({"outputs", "sweep --slurm --out inside the model folder",
               [](const std::string& d) {
                 write(d + "/sweep.json", R"({"tasks": ["copa"], "policies": ["full"], "limit": 2})");
                 return "sweep " + d + "/sweep.json --slurm --dry-run --model " + model_dir(d, "m", json::object()) +
                        " --out " + d + "/m/out";
               },
               {"--out", "lies in the model"}});
  output_case("merge --out a merged folder it reads (was its record and rows replaced)",
              [](const std::string& r) {
                write(r + "/config.json", R"({"config": {"tasks": ["copa"]}, "shard": [0, 1], "merged_from": ["x"]})");
                return "merge " + r + " --out " + r;
              },
              {"--out", "the shard folder"});
  output_case("export --notebook a link to R/results.csv",
              [](const std::string& r) {
                fs::create_symlink(r + "/results.csv", r + "/../n.ipynb");
                return "export " + r + " --notebook " + r + "/../n.ipynb";
              },
              {"--notebook", "results.csv", "never overwrites"});

  // analyze --config: an entry's name is one folder under --out.
  auto analyze_entry_case = [&](const std::string& name, const std::string& entry, std::vector<std::string> expected) {
    c.push_back({"analyze config", name,
                 [=](const std::string& d) {
                   write(d + "/sweep.json", R"({"tasks": ["copa"], "analyze": [)" + entry + "]}");
                   return "analyze --config " + d + "/sweep.json --out " + d + "/out";
                 },
                 expected});
  };
  analyze_entry_case("entry name ../../x (was written outside --out)",
                     R"({"name": "../../x", "text_file": "text/tinystories_sample.txt"})",
                     {"sweep.json", "\"name\"", "../../x", "one path component"});
  analyze_entry_case("entry name /tmp/x (was written there)",
                     R"({"name": "/tmp/kvevict_analyze_x", "text_file": "text/tinystories_sample.txt"})",
                     {"sweep.json", "\"name\"", "/tmp/kvevict_analyze_x"});
  analyze_entry_case("entry name .. (was --out's parent)", R"({"name": "..", "text_file": "text/tinystories_sample.txt"})",
                     {"sweep.json", "\"name\"", "\"..\""});
  analyze_entry_case("entry with text_file and task (was a CLI-flag message)",
                     R"({"name": "a", "task": "copa", "text_file": "text/tinystories_sample.txt"})",
                     {"sweep.json", "analyze entry \"a\"", "\"text_file\"", "\"task\"", "not both"});
  analyze_entry_case("entry with neither text_file nor task (was a CLI-flag message)", R"({"name": "a", "limit": 2})",
                     {"sweep.json", "analyze entry \"a\"", "\"text_file\" or \"task\""});
  analyze_entry_case("entry with an unknown recall policy (named no key)",
                     R"({"name": "a", "task": "copa", "recall_policies": ["lru"]})",
                     {"sweep.json", "\"recall_policies\"", "lru"});
  analyze_entry_case("entry with an unknown task (named no key)", R"({"name": "a", "task": "boolq"})",
                     {"sweep.json", "\"task\"", "boolq"});

  // kvevict status: slurm/sweep.json's values bound the work and go to squeue.
  auto status_case = [&](const std::string& name, const json& patch, std::vector<std::string> expected,
                         const std::string& flags = "") {
    c.push_back({"slurm status", name,
                 [=](const std::string& d) {
                   json record = {{"config", {{"tasks", {"copa"}}, {"policies", {"full", "h2o"}}, {"budgets", {0.2, 0.5}}, {"limit", 2}}},
                                  {"shards", 3},
                                  {"config_path", d + "/sweep.json"},
                                  {"submissions", json::array({{{"array_job", "100"}, {"shards", {0, 1, 2}}, {"merge_job", "101"},
                                                                {"sbatch_options", json::object()}}})}};
                   record.merge_patch(patch);
                   write(d + "/S/slurm/sweep.json", record.dump());
                   return "status " + d + "/S" + flags;
                 },
                 expected});
  };
  status_case("shards 10^9 (was minutes of work)", {{"shards", 1000000000}}, {"slurm/sweep.json", "\"shards\"", "1000000000"});
  status_case("shards 0 (was accepted)", {{"shards", 0}}, {"slurm/sweep.json", "\"shards\"", "0"});
  status_case("shards -3 (was accepted)", {{"shards", -3}}, {"slurm/sweep.json", "\"shards\"", "-3"});
  status_case("shards above the cells", {{"shards", 50}}, {"slurm/sweep.json", "\"shards\"", "more than the sweep's 3 cells"});
  status_case("shards as text (was a JSON-library message)", {{"shards", "3"}}, {"slurm/sweep.json", "\"shards\""});
  status_case("shard index 99 (was accepted)",
              {{"submissions", json::array({{{"array_job", "100"}, {"shards", {0, 99}}}})}},
              {"slurm/sweep.json", "submissions[0].shards", "99"});
  status_case("shard index -1 (was accepted)",
              {{"submissions", json::array({{{"array_job", "100"}, {"shards", {-1}}}})}},
              {"slurm/sweep.json", "submissions[0].shards", "-1"});
  status_case("job id \"1; touch x\" (was passed to squeue)",
              {{"submissions", json::array({{{"array_job", "1; touch x"}, {"shards", {0}}}})}},
              {"slurm/sweep.json", "submissions[0].array_job", "not a Slurm job id"});
  status_case("merge job id with an option (was passed to squeue)",
              {{"submissions", json::array({{{"array_job", "100"}, {"shards", {0}}, {"merge_job", "--all"}}})}},
              {"slurm/sweep.json", "submissions[0].merge_job", "--all"});
  status_case("submissions not a list (was a JSON-library message)", {{"submissions", 5}},
              {"slurm/sweep.json", "\"submissions\""});
  status_case("an sbatch option kvevict does not pass",
              {{"submissions", json::array({{{"array_job", "100"}, {"shards", {0}}, {"sbatch_options", {{"wrap", "x"}}}}})}},
              {"slurm/sweep.json", "sbatch_options.wrap"});
  status_case("--log-lines -1 (was accepted)", json::object(), {"--log-lines", "-1"}, " --log-lines -1");

  // sweep --slurm counts: -1 used to mean "not given" and was dropped.
  auto slurm_flag_case = [&](const std::string& name, const std::string& flags, std::vector<std::string> expected) {
    c.push_back({"slurm flags", name,
                 [=](const std::string& d) {
                   write(d + "/sweep.json", R"({"tasks": ["copa"], "policies": ["full", "h2o"], "budgets": [0.2, 0.5], "limit": 2})");
                   return "sweep " + d + "/sweep.json --out " + d + "/out --slurm --dry-run " + flags;
                 },
                 expected});
  };
  slurm_flag_case("--shards -1 (was dropped)", "--shards -1", {"--shards", "-1"});
  slurm_flag_case("--max-parallel -1 (was dropped)", "--max-parallel -1", {"--max-parallel", "-1"});
  slurm_flag_case("--cpus-per-task -1 (was dropped)", "--cpus-per-task -1", {"--cpus-per-task", "-1"});
  slurm_flag_case("--shards 20000 (above the ceiling)", "--shards 20000", {"--shards", "20000", "10000"});

  // Silent acceptance.
  cli_case("eval --greedy on a multiple-choice task (was ignored)", "eval --task copa --limit 2 --greedy", "--greedy");
  auto export_case = [&](const std::string& name, const std::string& csv, const std::string& command,
                         std::vector<std::string> expected) {
    c.push_back({"exports", name,
                 [=](const std::string& d) {
                   write(d + "/r/results.csv", csv);
                   std::string args = command == "table" ? "table " + d + "/r --out " + d + "/t"
                                      : command == "svg" ? "export " + d + "/r --svg " + d + "/svg"
                                                         : "export " + d + "/r --notebook " + d + "/n.ipynb";
                   return args;
                 },
                 expected});
  };
  auto replaced = [](std::string row, const std::string& from, const std::string& to) {
    row.replace(row.find(from), from.size(), to);
    return row;
  };
  export_case("a NUL byte in a cell (was copied into the table)",
              results_header() + replaced(good_row(), "full", std::string("fu\0ll", 5)), "table",
              {"results.csv:2", "policy", "NUL"});
  export_case("value nan (was an empty svg/ and exit 0)", results_header() + replaced(good_row(), ",0.5,", ",nan,"), "svg",
              {"results.csv:2", "value", "nan", "finite"});
  export_case("value 1e999 (was an empty svg/ and exit 0)", results_header() + replaced(good_row(), ",0.5,", ",1e999,"),
              "svg", {"results.csv:2", "value", "1e999"});
  export_case("invalid UTF-8 (was SVG that is not XML)",
              results_header() + replaced(good_row(), "full", "fu\xff\xfell"), "svg", {"results.csv:2", "policy", "UTF-8"});
  export_case("header only: notebook (was an empty notebook, exit 0)", results_header(), "notebook",
              {"results.csv", "no result rows"});
  export_case("header only: table (was an empty table, exit 0)", results_header(), "table", {"results.csv", "no result rows"});
  c.push_back({"analyze", "an empty --tokens-file (was 0 sequences, exit 0)",
               [](const std::string& d) {
                 write(d + "/tokens.txt", "\n");
                 return "analyze --tokens-file " + d + "/tokens.txt";
               },
               {"tokens.txt", "no tokens"}});
  cli_case("analyze --max-tokens 0 (was the whole text)", "analyze " + kText + " --max-tokens 0", "--max-tokens");
  cli_case("analyze --max-tokens -1 (was the whole text)", "analyze " + kText + " --max-tokens -1", "--max-tokens");
  cli_case("analyze --block-rows -5", "analyze " + kText + " --block-rows -5", "--block-rows");

  // Sweep grids whose cells cannot run: refused at expansion, naming the key.
  sweep_case("pipeline h2o with cnndm and shots [3] (was every cell failing)",
             {{"tasks", {"cnndm"}}, {"pipeline", "h2o"}, {"shots", {3}}, {"policies", {"full"}}}, "\"shots\"");
  sweep_case("pipeline h2o with perplexity (was every cell failing)",
             {{"tasks", {"perplexity"}}, {"pipelines", {"lm-eval", "h2o"}}, {"policies", {"full"}}}, "\"tasks\"");
  sweep_case("pipeline h2o with prefill-compress on copa (was every cell failing)",
             {{"pipeline", "h2o"}, {"protocols", {"prefill-compress"}}}, "\"protocols\"");

  // Issue 43, long-context tasks: refused at once, before any item is built.
  const std::string niah = "eval --task niah --depth 0.5 --limit 1 ";
  c.push_back({"flags", "niah --length 10^9 (was running until killed)",
               [=](const std::string&) { return niah + "--length 1000000000"; },
               {"--length 1000000000", "context of 512"}});
  // Item 0 alone fits 174 tokens; others need more: refused whichever items are asked for.
  c.push_back({"flags", "niah --length 174 --limit 1 (was run: only some items fit it)",
               [=](const std::string&) { return niah + "--length 174"; },
               {"niah: length 174 is too short", "every item fits from", "xsum_test_1000.jsonl"}});
  cli_case("niah --max-length below --length (was ignored)", niah + "--length 300 --max-length 200", "--max-length 200");
  cli_case("--seed -1 (was 2^64 - 1)", "eval --task copa --limit 2 --seed -1", "--seed");
  c.push_back({"flags", "--seed 2^64 (was wrapped)",
               [](const std::string&) { return "eval --task copa --limit 2 --seed 18446744073709551616"; },
               {"--seed", "overflows"}});
  cli_case("--seed 1e23 (was 2^64 - 1)", "generate --max-new-tokens 1 --seed 1e23", "--seed");
  cli_case("--fewshot-seed -5 (was accepted)", "eval --task copa --limit 2 --fewshot-seed -5", "--fewshot-seed");
  cli_case("make-random-model --seed -1 (was 2^64 - 1)", "make-random-model --out /nonexistent/r --seed -1", "--seed");
  c.push_back({"files", "niah haystack of one three-word article (was the words repeated)",
               [](const std::string& d) {
                 write(d + "/data/xsum/xsum_test_1000.jsonl", R"({"document": "Cats sat down.", "summary": "Cats."})" "\n");
                 return "--data-dir " + d + "/data eval --task niah --depth 0.5 --length 300 --limit 1 --model " +
                        kvevict::test::data("models/stories260K-hf");
               },
               {"xsum_test_1000.jsonl: 3 words", "length 300"}});
  sweep_case("lengths on copa alone (was ignored)", {{"lengths", {256}}}, "\"lengths\"");
  sweep_case("depths with ruler_vt alone (was ignored)", {{"tasks", {"ruler_vt"}}, {"lengths", {256}}, {"depths", {0.5}}},
             "\"depths\"");
  sweep_case("questions agnostic under the stream protocol (was every cell skipped)",
             {{"tasks", {"niah"}}, {"lengths", {256}}, {"depths", {0.5}}, {"questions", {"agnostic"}}}, "\"questions\"");
  sweep_case("max_length below a length (was ignored)",
             {{"tasks", {"niah"}}, {"lengths", {256}}, {"depths", {0.5}}, {"max_length", 100}}, "\"max_length\"");
  sweep_case("a length past the model's context (was running until killed)",
             {{"tasks", {"niah"}}, {"lengths", {100000}}, {"depths", {0.5}}}, "\"lengths\" 100000");

  // Issue 43, KIVI and DMC: contradictions refused, not resolved silently one way.
  cli_case("--kv-quant none --kv-bits 4 (was fp16)", gen + "--kv-quant none --kv-bits 4", "--kv-bits 4");
  cli_case("--kv-quant kivi --kv-bits 16 (was a 2-bit cache)", gen + "--kv-quant kivi --kv-bits 16", "--kv-bits 16");
  cli_case("--kv-bits 16 with --kv-group (was ignored)", gen + "--kv-bits 16 --kv-group 8", "--kv-group");
  cli_case("--kv-residual 2^30 (was accepted)", gen + "--kv-quant kivi --kv-group 8 --kv-residual 1073741824", "--kv-residual");
  cli_case("--kv-residual 2^31 - 8 (was accepted)", gen + "--kv-quant kivi --kv-group 8 --kv-residual 2147483640",
           "--kv-residual");
  c.push_back({"flags", "--kv-residual past the model's context (was never flushed)",
               [=](const std::string&) { return gen + "--kv-quant kivi --kv-group 8 --kv-residual 1024"; },
               {"--kv-residual 1024", "context of 512"}});
  cli_case("--decode-target with --decode-ratio", gen + "--policy decoding+h2o --decode-target 64 --decode-ratio 0.5",
           "decode_ratio");
  cli_case("--block-size 0", gen + "--policy block+h2o --budget 0.5 --block-size 0", "--block-size");
  // Policies that rewrite kept slots (think+, cam+): ranges, and the caches they cannot rewrite.
  cli_case("--key-channel-compression-ratio 1.5", gen + "--policy think+h2o --budget 0.5 --key-channel-compression-ratio 1.5",
           "--key-channel-compression-ratio");
  cli_case("--merge-budget 0", gen + "--policy cam+h2o --budget 0.5 --merge-budget 0", "--merge-budget");
  cli_case("think+h2o over KIVI", gen + "--policy think+h2o --budget 0.5 --kv-quant kivi --kv-group 8 --kv-residual 16",
           "think+h2o");
  cli_case("think+h2o under the stream protocol (no prefill to prune at)",
           "perplexity " + kText + " --policy think+h2o --budget 0.5 --prefill 0", "stream protocol");
  cli_case("--kv-memory with the full cache (was ignored)", gen + "--policy full --kv-memory 0.5", "--kv-memory");
  cli_case("eval: sim-only policy with KIVI (was refused per document)",
           "eval --task copa --limit 2 --policy h2o-paper --heavy-ratio 0.1 --recent-ratio 0.1 --kv-quant kivi "
           "--kv-group 8 --kv-residual 16",
           "is sim-only");
  cli_case("perplexity --prefill 200 --max-tokens 64 (was cut to 64)", "perplexity " + kText + " --prefill 200 --max-tokens 64",
           "--prefill 200");
  auto dmc_case = [&](const std::string& name, const std::string& flags, std::vector<std::string> expected) {
    c.push_back({"flags", name,
                 [=](const std::string& d) {
                   write(d + "/tokens.txt", "2 5 7 9 11 13 17 19");
                   return "perplexity --model " + kvevict::test::data("models/tiny-random-llama-dmc") + " --tokens-file " +
                          d + "/tokens.txt " + flags;
                 },
                 expected});
  };
  dmc_case("DMC with ada+h2o (was run untested)", "--policy ada+h2o --budget-tokens 4", {"ada+h2o", "DMC"});
  dmc_case("DMC with think+h2o (its pruning rewrites slots DMC merges)", "--policy think+h2o --budget-tokens 4 --prefill 4",
           {"think+h2o", "DMC"});
  dmc_case("DMC with cam+h2o (its merges rewrite slots DMC merges)", "--policy cam+h2o --budget-tokens 4", {"cam+h2o", "DMC"});
  dmc_case("DMC with --kv-memory (was a byte bound of rows, not slots)", "--policy h2o --kv-memory 0.5",
           {"--kv-memory", "DMC"});
  sweep_case("kv_memories beside budgets (was two kinds of cell)", {{"kv_memories", {0.5}}}, "\"kv_memories\"");
  sweep_case("kv_memories with the full cache alone (was ignored)",
             {{"policies", {"full"}}, {"budgets", nullptr}, {"kv_memories", {0.5}}}, "\"kv_memories\"");
  sweep_case("kv_memories with a sim-only policy",
             {{"policies", {"h2o-paper"}}, {"budgets", nullptr}, {"kv_memories", {0.5}}}, "h2o-paper");
  c.push_back({"sweep config", "kivi with the default kv_group 32 on head_dim 8 (was each cell failing)",
               [](const std::string& d) {
                 write(d + "/sweep.json", R"({"tasks": ["copa"], "policies": ["h2o"], "budgets": [0.5], "limit": 2,
                                              "kv_quant": "kivi"})");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"sweep.json", "cell task=copa", "kv_group 32", "head_dim 8"}});
  c.push_back({"sweep config", "kv_memories [1e-9] (was each cell failing)",
               [](const std::string& d) {
                 write(d + "/sweep.json", R"({"tasks": ["copa"], "policies": ["h2o"], "kv_memories": [1e-9], "limit": 2})");
                 return "sweep " + d + "/sweep.json --out " + d + "/out";
               },
               {"sweep.json", "cell task=copa", "kv_memories", "keeps no token"}});
  return c;
}

}  // namespace

TEST_CASE("bad inputs: one clear line, a non-zero exit, no signal, files untouched", "[errors][bad-input]") {
  const auto all = cases();
  REQUIRE(all.size() >= 312);  // the table's size today: a case lost is a failure
  int clean = 0;
  std::map<std::string, std::pair<int, int>> per_group;  // group -> (clean, cases)
  // KVEVICT_BAD_INPUT_FILTER=TEXT runs only the cases whose group or name contains TEXT.
  const char* filter = std::getenv("KVEVICT_BAD_INPUT_FILTER");
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& bad = all[i];
    if (filter && (bad.group + ": " + bad.name).find(filter) == std::string::npos) continue;
    const kvevict::test::TempDir folder("bad_input_" + std::to_string(i));
    const std::string& dir = folder.path();
    const std::string args = bad.setup(dir);
    const auto before = snapshot(dir);
    const auto result = kvevict::test::run_kvevict(args);
    INFO(bad.group << ": " << bad.name << "\n  kvevict " << args << "\n  stderr: " << result.err);
    const bool exited = result.exit_code == 1;  // README: exit code 1 (-1: killed by a signal)
    const bool one_line = std::count(result.err.begin(), result.err.end(), '\n') == 1 &&
                          result.err.back() == '\n';
    bool names_it = true;
    for (const auto& key : bad.expected) names_it = names_it && result.err.find(key) != std::string::npos;
    const bool no_internals = result.err.find("frame #") == std::string::npos &&
                              result.err.find("json.exception") == std::string::npos &&
                              result.err.find("basic_filebuf") == std::string::npos;
    const bool untouched = snapshot(dir) == before;
    CHECK(exited);
    CHECK(one_line);
    CHECK(names_it);
    CHECK(no_internals);
    CHECK(untouched);
    const bool ok = exited && one_line && names_it && no_internals && untouched;
    clean += ok;
    per_group[bad.group].first += ok;
    per_group[bad.group].second += 1;
  }
  std::string groups;
  for (const auto& [group, counts] : per_group)
    groups += "\n  " + group + ": " + std::to_string(counts.first) + " of " + std::to_string(counts.second);
  WARN("bad-input suite: " << clean << " of " << all.size() << " cases gave a clean error" << groups);
}
