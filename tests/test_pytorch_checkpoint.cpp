// pytorch_model.bin (torch.save pickles): the zip and legacy containers, the
// restricted unpickler, and one-line errors for damaged files. Test archives are built
// byte by byte (tests/pickle_bytes.h), so every byte they hold is explained.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "harness/common/errors.h"
#include "harness/model/pytorch_checkpoint.h"
#include "harness/model/restricted_unpickler.h"
#include "harness/model/safetensors.h"
#include "harness/model/zip_archive.h"
#include "tests/pickle_bytes.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;
using namespace kvevict::test::pickle_bytes;
namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string open_error(const std::string& dir) {
  try {
    WeightStore::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A copy of a model directory that a test may damage.
std::string copy_checkpoint_model(const std::string& model_dir, const std::string& name) {
  auto dir = test::temp_dir(name);
  for (auto& entry : fs::directory_iterator(test::data(model_dir)))
    fs::copy_file(entry.path(), fs::path(dir) / entry.path().filename());
  for (auto& entry : fs::directory_iterator(dir))
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  return dir;
}

// Writes the CRC-32 of a stored record's current bytes into its central directory entry
// and local header, so that a test can change a record's content without the CRC check
// catching it first.
void refresh_crc(Bytes& archive, const std::string& record) {
  const auto* data = reinterpret_cast<const uint8_t*>(archive.data());
  ZipArchive zip("archive", data, archive.size());
  const ZipEntry* entry = zip.find(record);
  REQUIRE(entry);
  const uint32_t crc = zip_crc32(zip.stored_data(*entry, record), entry->size);
  const size_t central = archive.rfind(record) - 46;  // the directory comes last
  REQUIRE(archive.compare(central, 4, "PK\x01\x02") == 0);
  for (size_t at : {central + 16, static_cast<size_t>(entry->local_header_offset) + 14})
    for (int i = 0; i < 4; ++i) archive[at + i] = static_cast<char>(crc >> (8 * i));
}

// `kvevict perplexity` on a damaged model directory: it must fail with one line.
std::string cli_error(const std::string& dir) {
  auto tokens = fs::path(dir) / "tokens.txt";
  std::ofstream(tokens) << "2 5 7 9 11";
  auto r = test::run_kvevict("perplexity --model " + dir + " --tokens-file " + tokens.string());
  CHECK(r.exit_code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Catch::StartsWith("kvevict: error: "));
  return r.err;
}

}  // namespace

TEST_CASE("hand-built zip checkpoints: dtypes, offsets, shared and strided storages", "[pickle]") {
  // Storage 0: six floats 0..5 shared by a matrix, its transpose (strides 1,3) and a
  // slice at offset 4. Storage 1: float16 1.5, -2, 0.25. Storage 2: bfloat16 1, -3.
  std::vector<PickledTensor> tensors = {
      {"w", "FloatStorage", "0", 6, 0, {2, 3}, {3, 1}},
      {"w_t", "FloatStorage", "0", 6, 0, {3, 2}, {1, 3}},
      {"tail", "FloatStorage", "0", 6, 4, {2}, {1}},
      {"scalar", "FloatStorage", "0", 6, 5, {}, {}},
      {"half", "HalfStorage", "1", 3, 0, {3}, {1}},
      {"bf16", "BFloat16Storage", "2", 2, 0, {1, 2}, {2, 1}},
  };
  for (bool zip64 : {false, true}) {
    for (bool metadata : {false, true}) {
      INFO("zip64 " << zip64 << " metadata " << metadata);
      auto dir = test::temp_dir("pickle_handbuilt");
      write_file(fs::path(dir) / "pytorch_model.bin",
                 write_zip({{"archive/data.pkl", state_dict_pickle(tensors, metadata)},
                            {"archive/byteorder", "little"},
                            {"archive/data/0", floats({0, 1, 2, 3, 4, 5})},
                            {"archive/data/1", halves({0x3E00, 0xC000, 0x3400})},
                            {"archive/data/2", halves({0x3F80, 0xC040})},
                            {"archive/version", "3\n"}},
                           zip64));
      auto store = WeightStore::open(dir);
      CHECK(store.names().size() == tensors.size());
      auto get = [&](const std::string& n) { return store.get(n, torch::kFloat32, torch::kCPU); };
      auto expect = [](std::vector<float> v, std::vector<int64_t> shape) {
        return torch::tensor(v).reshape(shape);
      };
      CHECK(torch::equal(get("w"), expect({0, 1, 2, 3, 4, 5}, {2, 3})));
      CHECK(torch::equal(get("w_t"), expect({0, 3, 1, 4, 2, 5}, {3, 2})));
      CHECK(get("w_t").is_contiguous());
      CHECK(torch::equal(get("tail"), expect({4, 5}, {2})));
      CHECK(get("scalar").dim() == 0);
      CHECK(get("scalar").item<float>() == 5.0f);
      CHECK(store.info("half").dtype == "F16");
      CHECK(torch::equal(get("half"), expect({1.5f, -2.0f, 0.25f}, {3})));
      CHECK(store.info("bf16").dtype == "BF16");
      CHECK(torch::equal(get("bf16"), expect({1.0f, -3.0f}, {1, 2})));
    }
  }
}

TEST_CASE("protocol 4 pickles (FRAME, STACK_GLOBAL, MEMOIZE) are read", "[pickle]") {
  auto s = [](const std::string& text) {  // SHORT_BINUNICODE, then MEMOIZE
    return "\x8c" + std::string(1, static_cast<char>(text.size())) + text + "\x94";
  };
  // Memo: 0 "collections", 1 "OrderedDict", 2 the OrderedDict global, 3 the state dict.
  Bytes body = s("collections") + s("OrderedDict") + "\x93\x94)R\x94" + s("w") + s("torch._utils") +
               s("_rebuild_tensor_v2") + "\x93\x94((" + s("storage") + s("torch") + s("FloatStorage") + "\x93\x94" +
               s("0") + s("cpu") + "K\x02t\x94QK\x01K\x01\x85\x94K\x01\x85\x94\x89h\x02)R\x94t\x94R\x94s.";
  Bytes pickle = "\x80\x04\x95";
  put64(pickle, body.size());
  pickle += body;
  auto dir = test::temp_dir("pickle_protocol4");
  write_file(fs::path(dir) / "pytorch_model.bin",
             write_zip({{"archive/data.pkl", pickle}, {"archive/data/0", floats({7, 8})}}, false));
  auto store = WeightStore::open(dir);
  REQUIRE(store.names() == std::vector<std::string>{"w"});
  CHECK(torch::equal(store.get("w", torch::kFloat32, torch::kCPU), torch::tensor({8.0f})));
}

TEST_CASE("a pickle that calls os.system or any other global is refused and nothing runs", "[pickle][security]") {
  auto dir = test::temp_dir("pickle_malicious");
  std::ofstream(fs::path(dir) / "config.json")
      << test::read_text(test::data("models/tiny-random-opt-bin/config.json"));
  const fs::path marker = fs::path(dir) / "pwned";
  const std::string command = "touch " + marker.string();
  const Bytes call = str(command) + "\x85R.";  // (command,) then REDUCE
  struct Case {
    std::string payload, named;  // the pickle, and what the refusal must name
  };
  std::vector<Case> cases = {
      {"\x80\x02" "cposix\nsystem\n" + call, "global posix.system"},
      {"\x80\x02" "cos\nsystem\n" + call, "global os.system"},
      // protocol 4's STACK_GLOBAL takes module and name from the stack
      {"\x80\x04" + str("os") + str("system") + "\x93" + call, "global os.system"},
      {"\x80\x02" "cbuiltins\neval\n" + str("__import__('os').system('" + command + "')") + "\x85R.",
       "global builtins.eval"},
      {"\x80\x02" "cnumpy.core.multiarray\n_reconstruct\n" + call, "global numpy.core.multiarray._reconstruct"},
      {"\x80\x02" "ctorch._utils\n_rebuild_parameter\n" + call, "global torch._utils._rebuild_parameter"},
      // an allowed global that is not callable, and pickle's other ways to call
      {"\x80\x02" "ctorch\nFloatStorage\n" + call, "REDUCE may only call"},
      {"\x80\x02(" + str(command) + "ios\nsystem\n.", "opcode INST"},
      {"\x80\x02" "cos\nsystem\n)\x81.", "global os.system"},
  };
  for (const Case& c : cases) {
    INFO(c.named);
    for (bool legacy : {false, true}) {
      const fs::path file = fs::path(dir) / "pytorch_model.bin";
      if (legacy)
        write_file(file, legacy_header() + c.payload);
      else
        write_file(file, write_zip({{"archive/data.pkl", c.payload}, {"archive/version", "3\n"}}, false));
      auto message = open_error(dir);
      CHECK_THAT(message, Catch::Contains(file.string()) && Catch::Contains(c.named));
      if (&c == &cases[0] || &c == &cases[1]) {  // the CLI too (it starts LibTorch: slow)
        auto cli = cli_error(dir);
        CHECK_THAT(cli, Catch::Contains(file.string()) && Catch::Contains(c.named));
      }
      CHECK(!fs::exists(marker));
    }
  }
}

TEST_CASE("a pickle that puts a list or dict inside itself is refused", "[pickle][errors]") {
  // Through the memo a container can be appended to itself: a shared_ptr cycle that
  // would never be freed (fuzz_pytorch_bin found it under LeakSanitizer).
  auto dir = test::temp_dir("pickle_cycle");
  std::ofstream(fs::path(dir) / "config.json")
      << test::read_text(test::data("models/tiny-random-opt-bin/config.json"));
  const fs::path file = fs::path(dir) / "pytorch_model.bin";
  const std::vector<std::pair<Bytes, std::string>> cases = {
      {Bytes("\x80\x02]q\x00h\x00" "a.", 9), "APPEND would put a list inside itself"},  // l.append(l)
      {Bytes("\x80\x02]q\x00(]h\x00" "ae.", 12), "APPENDS would put a list inside itself"},  // l.extend([[l]])
      {Bytes("\x80\x02}q\x00X\x01\x00\x00\x00kh\x00s.", 15), "SETITEM would put a dict inside itself"},  // d['k'] = d
  };
  for (const auto& [payload, named] : cases) {
    INFO(named);
    write_file(file, write_zip({{"archive/data.pkl", payload}, {"archive/version", "3\n"}}, false));
    CHECK_THAT(open_error(dir), Catch::Contains(file.string()) && Catch::Contains(named));
  }
}

TEST_CASE("damaged pytorch_model.bin files fail with one line naming the file and tensor", "[pickle][errors]") {
  const std::string model = "models/tiny-random-opt-bin";
  SECTION("truncated zip: the file ends inside a storage record") {
    auto dir = copy_checkpoint_model(model, "pickle_truncated");
    auto file = fs::path(dir) / "pytorch_model.bin";
    fs::resize_file(file, 227000);  // inside the central directory, after every record
    CHECK_THAT(cli_error(dir), Catch::Contains(file.string()) && Catch::Contains("central directory") &&
                                   Catch::Contains("cut off"));
    fs::resize_file(file, 110000);  // inside pytorch_model/data/15, at 103504..111760
    auto msg = cli_error(dir);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("truncated zip archive") &&
                        Catch::Contains("pytorch_model/data/15") &&
                        Catch::Contains("tensor decoder.layers.0.self_attn.q_proj.weight"));
    fs::resize_file(file, 1000);  // inside the state-dict pickle
    CHECK_THAT(cli_error(dir), Catch::Contains(file.string()) && Catch::Contains("pytorch_model/data.pkl"));
  }
  SECTION("a storage record missing from the archive") {
    auto dir = copy_checkpoint_model(model, "pickle_missing_record");
    auto file = fs::path(dir) / "pytorch_model.bin";
    // Rename data/7 in the central directory (the last occurrence of its name).
    auto bytes = test::read_text(file.string());
    auto at = bytes.rfind("pytorch_model/data/7");
    REQUIRE(at != std::string::npos);
    bytes[at + 19] = 'x';
    write_file(file, bytes);
    auto msg = cli_error(dir);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("tensor decoder.layers.0.fc2.weight") &&
                        Catch::Contains("pytorch_model/data/7 is missing"));
  }
  SECTION("a storage shorter than its tensor") {
    auto dir = copy_checkpoint_model(model, "pickle_short_storage");
    auto file = fs::path(dir) / "pytorch_model.bin";
    // The first persistent id, storage 0 of decoder.embed_positions.weight, declares
    // 8320 elements (BININT2 0x2080); make it 100.
    auto bytes = test::read_text(file.string());
    const std::string numel("cpuq\x07M\x80\x20", 8);
    auto at = bytes.find(numel);
    REQUIRE(at != std::string::npos);
    bytes[at + 6] = 100;
    bytes[at + 7] = 0;
    refresh_crc(bytes, "pytorch_model/data.pkl");  // a pickle changed on purpose, not by damage
    write_file(file, bytes);
    auto msg = cli_error(dir);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("tensor decoder.embed_positions.weight") &&
                        Catch::Contains("shorter than its tensor"));
  }
  SECTION("a storage record with fewer bytes than its storage declares") {
    auto dir = test::temp_dir("pickle_short_record");
    write_file(fs::path(dir) / "pytorch_model.bin",
               write_zip({{"archive/data.pkl", state_dict_pickle({{"w", "FloatStorage", "0", 6, 0, {6}, {1}}}, false)},
                          {"archive/data/0", floats({0, 1, 2})}},
                         false));
    CHECK_THAT(open_error(dir), Catch::Contains("pytorch_model.bin: tensor w") && Catch::Contains("12 bytes"));
  }
  SECTION("a compressed record") {
    auto dir = test::temp_dir("pickle_deflated");
    write_file(fs::path(dir) / "pytorch_model.bin",
               write_zip({{"archive/data.pkl", state_dict_pickle({{"w", "FloatStorage", "0", 1, 0, {1}, {1}}}, false)},
                          {"archive/data/0", floats({0}), 8}},
                         false));
    CHECK_THAT(open_error(dir), Catch::Contains("tensor w") && Catch::Contains("compressed"));
  }
  SECTION("an unsupported storage type") {
    auto dir = test::temp_dir("pickle_complex");
    write_file(fs::path(dir) / "pytorch_model.bin",
               write_zip({{"archive/data.pkl", state_dict_pickle({{"w", "ComplexFloatStorage", "0", 1, 0, {1}, {1}}}, false)},
                          {"archive/data/0", floats({0, 0})}},
                         false));
    CHECK_THAT(open_error(dir), Catch::Contains("tensor w") && Catch::Contains("torch.ComplexFloatStorage"));
  }
  SECTION("a truncated legacy file") {
    auto dir = copy_checkpoint_model("models/tiny-random-opt-bin-legacy", "pickle_legacy_truncated");
    auto file = fs::path(dir) / "pytorch_model.bin";
    fs::resize_file(file, fs::file_size(file) - 100);
    auto msg = cli_error(dir);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("tensor model.decoder.") &&
                        Catch::Contains("truncated"));
  }
}

TEST_CASE("pickle checkpoints hold the same weights as their safetensors twins", "[pickle]") {
  auto same = [](const std::string& pickled, const std::string& safetensors, const std::string& prefix,
                 bool fp16) {
    INFO(pickled);
    auto a = WeightStore::open(test::data(pickled));
    auto b = WeightStore::open(test::data(safetensors));
    CHECK(a.names().size() == b.names().size());
    for (const std::string& name : b.names()) {
      std::string pickled_name = name.substr(0, prefix.size()) == prefix ? name.substr(prefix.size()) : name;
      INFO(name);
      REQUIRE(a.has(pickled_name));
      auto want = b.get(name, torch::kFloat32, torch::kCPU);
      if (fp16) want = want.to(torch::kFloat16).to(torch::kFloat32);
      CHECK(torch::equal(a.get(pickled_name, torch::kFloat32, torch::kCPU), want));
    }
  };
  same("models/tiny-random-opt-bin", "models/tiny-random-opt", "model.", true);
  same("models/tiny-random-opt-bin-legacy", "models/tiny-random-opt", "", false);
  same("models/tiny-random-gptneox-bin-sharded", "models/tiny-random-gptneox", "", false);
}

TEST_CASE("a directory with both formats loads its safetensors", "[pickle]") {
  auto dir = copy_checkpoint_model("models/tiny-random-opt", "pickle_both");
  fs::copy_file(test::data("models/tiny-random-opt-bin/pytorch_model.bin"), fs::path(dir) / "pytorch_model.bin");
  auto store = WeightStore::open(dir);
  CHECK(store.has("model.decoder.embed_tokens.weight"));
  CHECK(store.info("model.decoder.embed_tokens.weight").dtype == "F32");
}

TEST_CASE("the pickle reader's work is linear in the file and its nesting bounded", "[pickle][errors]") {
  using pickle::unpickle;
  const auto nested = [](size_t levels) {
    return "\x80\x02" + std::string(levels, ']') + std::string(levels - 1, 'a') + ".";
  };
  const auto run = [](const Bytes& bytes) {
    return unpickle(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, "f.pkl");
  };
  // 1000 levels (Python's pickler stops near its recursion limit of 1000) are read.
  CHECK(run(nested(pickle::kMaxPickleNesting)).value->nesting == pickle::kMaxPickleNesting);
  CHECK_THROWS_WITH(run(nested(pickle::kMaxPickleNesting + 1)),
                    Catch::Contains("f.pkl: pickle byte") && Catch::Contains("more than 1000 levels"));
  // 200k levels in 400 KB: searching for a cycle under every APPEND made this quadratic
  // (past a minute) and freeing it recursed 200k deep.
  CHECK_THROWS_WITH(run(nested(200000)), Catch::Contains("more than 1000 levels"));
  // Tuples count too.
  CHECK_THROWS_WITH(run("\x80\x02" "N" + std::string(1001, '\x85') + "."), Catch::Contains("more than 1000 levels"));

  // Wide is fine: one list appended 100k times through the memo, and a dict of 100k keys
  // where every key is given twice (the second value wins, as in Python).
  Bytes wide("\x80\x02]q\x01(]q\x00", 9);
  for (int i = 1; i < 100000; ++i) wide += Bytes("h\x00", 2);
  wide += "e.";
  CHECK(run(wide).value->items.size() == 100000);
  Bytes dict = "\x80\x02}(";
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 100000; ++i) dict += str("k" + std::to_string(i)) + integer(round * 100000 + i);
  dict += "u.";
  const auto read = run(dict).value;
  REQUIRE(read->entries.size() == 100000);
  CHECK(read->entries[7].second->integer == 100007);
}

TEST_CASE("a container changed after it went into another is refused, a shared one is not", "[pickle][errors]") {
  const auto run = [](const Bytes& bytes) {
    return pickle::unpickle(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, "f.pkl");
  };
  // (l, l): one list twice through the memo.
  CHECK(run(Bytes("\x80\x02]q\x00h\x00\x86.", 9)).value->items.size() == 2);
  // a = []; b = [a]; then a.append(1): no cycle, but Python's pickler never writes it.
  CHECK_THROWS_WITH(run(Bytes("\x80\x02]q\x00]h\x00" "ah\x00K\x01" "a.", 15)),
                    Catch::Contains("APPEND would change a list that is already inside another container"));
}

TEST_CASE("tensor shapes whose sizes overflow 64 bits are refused by name", "[pickle][errors]") {
  // [2^62, 2^62] with strides [2^62, 1] was "reaches element 0 of storage 0, which holds only 2".
  const int64_t big = int64_t{1} << 62;
  for (bool zero_strides : {false, true}) {
    INFO("zero strides " << zero_strides);
    Bytes p = "\x80\x02" + kOrderedDict + "(" + str("w") + "ctorch._utils\n_rebuild_tensor_v2\n(";
    p += "(" + str("storage") + "ctorch\nFloatStorage\n" + str("0") + str("cpu") + integer(2) + "tQ";
    p += integer(0) + "(" + long8(big) + long8(big) + "t(" + (zero_strides ? integer(0) + integer(0) : long8(big) + integer(1)) +
         "t\x89" + kOrderedDict + "tRu.";
    auto dir = test::temp_dir("pickle_overflow");
    write_file(fs::path(dir) / "pytorch_model.bin",
               write_zip({{"archive/data.pkl", p}, {"archive/data/0", floats({1, 2})}}, false));
    CHECK_THAT(open_error(dir), Catch::Contains("pytorch_model.bin: tensor w: shape [4611686018427387904,"
                                                "4611686018427387904] overflows"));
  }
}

TEST_CASE("the zip structure is checked on every load", "[pickle][errors]") {
  const auto tensors = std::vector<PickledTensor>{{"w", "FloatStorage", "0", 2, 0, {2}, {1}}};
  const std::vector<ZipRecord> records = {{"archive/data.pkl", state_dict_pickle(tensors, false)},
                                          {"archive/data/0", floats({1, 2})}};
  auto dir = test::temp_dir("zip_structure");
  const fs::path file = fs::path(dir) / "pytorch_model.bin";
  const auto error_after = [&](bool zip64, const std::function<void(Bytes&, size_t end_record)>& damage) {
    Bytes bytes = write_zip(records, zip64);
    damage(bytes, bytes.size() - 22);
    write_file(file, bytes);
    return open_error(dir);
  };
  const auto set16 = [](Bytes& b, size_t at, uint16_t v) { b[at] = static_cast<char>(v), b[at + 1] = static_cast<char>(v >> 8); };
  const auto set32 = [&](Bytes& b, size_t at, uint32_t v) { set16(b, at, v & 0xFFFF), set16(b, at + 2, v >> 16); };
  CHECK(error_after(false, [](Bytes&, size_t) {}).empty());
  CHECK(error_after(true, [](Bytes&, size_t) {}).empty());
  // Without ZIP64 the end record's count is the count: 0xFFFF entries are not there.
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set16(b, e + 8, 0xFFFF), set16(b, e + 10, 0xFFFF); }),
             Catch::Contains(file.string() + ": corrupt zip archive: the end record counts 65535 entries, but the "
                             "central directory holds 2"));
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set16(b, e + 8, 1), set16(b, e + 10, 1); }),
             Catch::Contains("counts 1 entries, but the central directory holds") && Catch::Contains("bytes more"));
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set16(b, e + 8, 1); }),
             Catch::Contains("counts 2 entries in all but 1 on its disk"));
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set16(b, e + 4, 1); }), Catch::Contains("multi-disk"));
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set32(b, e + 16, 0x7FFFFFF0); }),
             Catch::Contains("the central directory") && Catch::Contains("runs past the end of the file"));
  CHECK_THAT(error_after(false, [&](Bytes& b, size_t e) { set32(b, e + 12, 50); }),
             Catch::Contains("does not end where the end record begins"));
  // With ZIP64 the end record keeps the values that fit, and 0xFFFF... only for one that does not.
  CHECK_THAT(error_after(true, [&](Bytes& b, size_t e) { set16(b, e + 8, 0xFFFF), set16(b, e + 10, 0xFFFF); }),
             Catch::Contains("the end record's entry count 65535 disagrees with the ZIP64 end record's 2 (the "
                             "placeholder stands only for a value too large for it)"));
  CHECK_THAT(error_after(true, [&](Bytes& b, size_t e) { set16(b, e + 10, 3); }),
             Catch::Contains("the end record's entry count 3 disagrees with the ZIP64 end record's 2"));
  CHECK_THAT(error_after(true, [&](Bytes& b, size_t e) { set32(b, e + 16, 0x7FFFFFF0); }),
             Catch::Contains("central directory offset 2147483632 disagrees"));
}

TEST_CASE("CRC-32s: data.pkl on every load, the tensors' records by verify_checksums", "[pickle][errors]") {
  CHECK(zip_crc32(reinterpret_cast<const uint8_t*>("123456789"), 9) == 0xCBF43926u);  // the check value
  for (size_t n : {0, 1, 7, 8, 9, 1000}) {
    const Bytes text(n, 'x');
    CHECK(zip_crc32(reinterpret_cast<const uint8_t*>(text.data()), n) == crc32(text));
  }
  const auto tensors = std::vector<PickledTensor>{{"w", "FloatStorage", "0", 2, 0, {2}, {1}}};
  auto dir = test::temp_dir("zip_crc");
  const fs::path file = fs::path(dir) / "pytorch_model.bin";
  Bytes good = write_zip({{"archive/data.pkl", state_dict_pickle(tensors, false)}, {"archive/data/0", floats({1, 2})}}, true);
  write_file(file, good);
  CHECK(PytorchCheckpointFile(file.string()).verify_checksums() == 1);

  Bytes pickle_flipped = good;
  pickle_flipped[pickle_flipped.find("cpu") + 2] = 'v';  // still a valid pickle
  write_file(file, pickle_flipped);
  CHECK_THAT(open_error(dir), Catch::Contains(file.string() + ": record archive/data.pkl (the state-dict pickle): "
                                              "its bytes have CRC-32"));

  Bytes data_flipped = good;
  const Bytes value = floats({1, 2});
  data_flipped[data_flipped.find(value) + 3] ^= 0x40;
  write_file(file, data_flipped);
  CHECK(open_error(dir).empty());  // a load does not read every weight
  CHECK_THROWS_WITH(PytorchCheckpointFile(file.string()).verify_checksums(),
                    Catch::Contains(file.string() + ": record archive/data/0 (the storage of tensor w): its bytes have "
                                                    "CRC-32") &&
                        Catch::Contains("the archive is corrupt"));
}

TEST_CASE("a damaged legacy magic number and a folder named pytorch_model.bin say so", "[pickle][errors]") {
  auto dir = copy_checkpoint_model("models/tiny-random-opt-bin-legacy", "pickle_legacy_magic");
  const fs::path file = fs::path(dir) / "pytorch_model.bin";
  Bytes bytes = test::read_text(file.string());
  bytes[3] = '\x06';  // LONG1's length: the magic's last bytes become opcodes (was "memo entry ... never stored")
  write_file(file, bytes);
  CHECK_THAT(open_error(dir), Catch::Contains(file.string() + ": not a PyTorch checkpoint") &&
                                  Catch::Contains("magic number"));
  bytes[3] = '\x0a';
  bytes[6] ^= 1;  // a magic number that parses, but is not torch's
  write_file(file, bytes);
  CHECK_THAT(open_error(dir), Catch::Contains("magic number"));

  fs::remove(file);
  fs::create_directories(file);
  CHECK(open_error(dir) == file.string() + ": is a folder, not a file");  // was "mmap failed: No such device"
}
