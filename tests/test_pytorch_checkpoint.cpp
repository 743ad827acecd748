// pytorch_model.bin (torch.save pickles): the zip and legacy containers, the
// restricted unpickler, and one-line errors for damaged files. Test archives are built
// here byte by byte, so every byte they hold is explained by this file.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "harness/common/errors.h"
#include "harness/model/pytorch_checkpoint.h"
#include "harness/model/safetensors.h"
#include "tests/test_support.h"
// Catch last: LibTorch pulls in glog, whose CHECK macros would shadow Catch's.
#undef CHECK
#undef CHECK_EQ
#include <catch2/catch.hpp>

using namespace kvevict;
namespace fs = std::filesystem;

namespace {

using Bytes = std::string;

void put16(Bytes& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}
void put32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}
void put64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t crc32(const Bytes& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

struct ZipRecord {
  std::string name;
  Bytes data;
  uint16_t method = 0;  // 0 stored; 8 claims deflate (the bytes are not really compressed)
};

// A minimal zip writer: local headers with the sizes, a 64-byte-aligned data start (as
// torch's writer pads), the central directory and the end record; with `zip64`, every
// size and offset goes through ZIP64 extra fields and the ZIP64 end record, as in
// multi-GB shards.
Bytes write_zip(const std::vector<ZipRecord>& records, bool zip64) {
  Bytes out, central;
  for (const ZipRecord& r : records) {
    const uint64_t offset = out.size();
    Bytes extra;
    if (zip64) {
      put16(extra, 1), put16(extra, 16), put64(extra, r.data.size()), put64(extra, r.data.size());
    }
    size_t data_start = offset + 30 + r.name.size() + extra.size() + 4;
    size_t pad = (64 - data_start % 64) % 64;
    put16(extra, 0x4246), put16(extra, static_cast<uint16_t>(pad)), extra.append(pad, 'Z');
    const uint32_t small_size = zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(r.data.size());
    put32(out, 0x04034b50), put16(out, zip64 ? 45 : 20), put16(out, 0), put16(out, r.method);
    put32(out, 0), put32(out, crc32(r.data)), put32(out, small_size), put32(out, small_size);
    put16(out, static_cast<uint16_t>(r.name.size())), put16(out, static_cast<uint16_t>(extra.size()));
    out += r.name + extra + r.data;

    Bytes cextra;
    if (zip64) {
      put16(cextra, 1), put16(cextra, 24), put64(cextra, r.data.size()), put64(cextra, r.data.size());
      put64(cextra, offset);
    }
    put32(central, 0x02014b50), put16(central, 45), put16(central, zip64 ? 45 : 20), put16(central, 0);
    put16(central, r.method), put32(central, 0), put32(central, crc32(r.data));
    put32(central, small_size), put32(central, small_size);
    put16(central, static_cast<uint16_t>(r.name.size())), put16(central, static_cast<uint16_t>(cextra.size()));
    put16(central, 0), put16(central, 0), put16(central, 0), put32(central, 0);
    put32(central, zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(offset));
    central += r.name + cextra;
  }
  const uint64_t directory_offset = out.size();
  out += central;
  if (zip64) {
    const uint64_t end64 = out.size();
    put32(out, 0x06064b50), put64(out, 44), put16(out, 45), put16(out, 45), put32(out, 0), put32(out, 0);
    put64(out, records.size()), put64(out, records.size()), put64(out, central.size()), put64(out, directory_offset);
    put32(out, 0x07064b50), put32(out, 0), put64(out, end64), put32(out, 1);
  }
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0);
  put16(out, zip64 ? 0xFFFF : static_cast<uint16_t>(records.size()));
  put16(out, zip64 ? 0xFFFF : static_cast<uint16_t>(records.size()));
  put32(out, zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(central.size()));
  put32(out, zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(directory_offset));
  put16(out, 0);
  return out;
}

// Pickle opcodes, spelled out.
Bytes str(const std::string& s) {
  Bytes b = "X";
  put32(b, static_cast<uint32_t>(s.size()));
  return b + s;
}
Bytes integer(int32_t v) {
  Bytes b = "J";
  put32(b, static_cast<uint32_t>(v));
  return b;
}
Bytes ints(const std::vector<int64_t>& v) {
  Bytes b = "(";
  for (auto x : v) b += integer(static_cast<int32_t>(x));
  return b + "t";
}
const Bytes kOrderedDict = "ccollections\nOrderedDict\n)R";

struct PickledTensor {
  std::string name, storage_global, key;
  int64_t numel, offset;
  std::vector<int64_t> size, stride;
};

// The state-dict pickle torch.save writes (protocol 2), optionally with the
// OrderedDict's _metadata attribute set by BUILD, as Module.state_dict() leaves it.
Bytes state_dict_pickle(const std::vector<PickledTensor>& tensors, bool with_metadata) {
  Bytes b = "\x80\x02" + kOrderedDict + "(";
  for (const auto& t : tensors) {
    b += str(t.name) + "ctorch._utils\n_rebuild_tensor_v2\n(";
    b += "(" + str("storage") + "ctorch\n" + t.storage_global + "\n" + str(t.key) + str("cpu") + integer(static_cast<int32_t>(t.numel)) + "tQ";
    b += integer(static_cast<int32_t>(t.offset)) + ints(t.size) + ints(t.stride) + "\x89" + kOrderedDict + "tR";
  }
  b += "u";
  if (with_metadata)
    b += "}(" + str("_metadata") + kOrderedDict + "(" + str("") + "}(" + str("version") + integer(1) + "uuub";
  return b + ".";
}

Bytes floats(const std::vector<float>& v) {
  return Bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
Bytes halves(const std::vector<uint16_t>& v) {
  return Bytes(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

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
std::string copy_model(const std::string& model_dir, const std::string& name) {
  auto dir = test::temp_dir(name);
  for (auto& entry : fs::directory_iterator(test::data(model_dir)))
    fs::copy_file(entry.path(), fs::path(dir) / entry.path().filename());
  for (auto& entry : fs::directory_iterator(dir))
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  return dir;
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

// The legacy container's three header pickles: magic number, protocol 1001, sys_info.
Bytes legacy_header() {
  Bytes b("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  b += Bytes("\x80\x02M\xe9\x03.", 6);
  b += "\x80\x02}(" + str("little_endian") + "\x88u.";
  return b;
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
    auto dir = copy_model(model, "pickle_truncated");
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
    auto dir = copy_model(model, "pickle_missing_record");
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
    auto dir = copy_model(model, "pickle_short_storage");
    auto file = fs::path(dir) / "pytorch_model.bin";
    // The first persistent id, storage 0 of decoder.embed_positions.weight, declares
    // 8320 elements (BININT2 0x2080); make it 100.
    auto bytes = test::read_text(file.string());
    const std::string numel("cpuq\x07M\x80\x20", 8);
    auto at = bytes.find(numel);
    REQUIRE(at != std::string::npos);
    bytes[at + 6] = 100;
    bytes[at + 7] = 0;
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
    auto dir = copy_model("models/tiny-random-opt-bin-legacy", "pickle_legacy_truncated");
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
  auto dir = copy_model("models/tiny-random-opt", "pickle_both");
  fs::copy_file(test::data("models/tiny-random-opt-bin/pytorch_model.bin"), fs::path(dir) / "pytorch_model.bin");
  auto store = WeightStore::open(dir);
  CHECK(store.has("model.decoder.embed_tokens.weight"));
  CHECK(store.info("model.decoder.embed_tokens.weight").dtype == "F32");
}
