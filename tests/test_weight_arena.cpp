// The weights' memory on the CPU (harness/model/weight_arena.h): 2 MiB pages asked of the
// kernel, the tensors aligned, alive as long as any of them, and the loaded model's
// weights in it with the checkpoint's values.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/model/safetensors.h"
#include "harness/model/weight_arena.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

// The smaps record of the mapping that holds `address` in this process: its lines.
std::string smaps_of(const void* address) {
  std::ifstream in("/proc/self/smaps");
  std::string line, record;
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    // A mapping's first line: "begin-end perms ...", both in hex.
    if ((head >> std::hex >> begin >> dash >> end) && dash == '-') {
      if (inside) return record;
      inside = begin <= at && at < end;
      record.clear();
    }
    if (inside) record += line + "\n";
  }
  return inside ? record : "";
}

// Whether the mapping holding `address` is advised MADV_HUGEPAGE: "hg" among its smaps
// VmFlags. The advice, not whether the kernel found free 2 MiB pages, which depends on the
// machine's memory.
bool advised_huge_pages(const void* address) {
  const std::string record = smaps_of(address);
  const size_t at = record.find("VmFlags:");
  if (at == std::string::npos) return false;
  std::istringstream flags(record.substr(at + 8, record.find('\n', at) - at - 8));
  std::string flag;
  while (flags >> flag)
    if (flag == "hg") return true;
  return false;
}

// A kernel built with transparent huge pages (whatever their mode) takes the advice.
bool kernel_has_transparent_huge_pages() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

}  // namespace

TEST_CASE("the weight arena hands out aligned tensors that outlive it, and refuses to overflow", "[model]") {
  torch::Tensor a, b;
  {
    WeightArena arena(weight_arena_bytes(7, torch::kFloat32) + weight_arena_bytes(5, torch::kBFloat16));
    a = arena.empty({7}, torch::kFloat32).copy_(torch::arange(7, torch::kFloat32));
    b = arena.empty({5}, torch::kBFloat16).fill_(1.5);
    CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 2097152 == 0);  // the first starts a huge page
    CHECK(reinterpret_cast<uintptr_t>(b.data_ptr()) % 64 == 0);
    CHECK(static_cast<char*>(b.data_ptr()) - static_cast<char*>(a.data_ptr()) == 64);
    // 2 MiB minus the 128 bytes used: one float32 element more than that is refused.
    CHECK_THROWS_AS(arena.empty({(2097152 - 128) / 4 + 1}, torch::kFloat32), Error);
    CHECK(arena.empty({(2097152 - 128) / 4}, torch::kFloat32).numel() == (2097152 - 128) / 4);
  }
  CHECK(torch::equal(a, torch::arange(7, torch::kFloat32)));  // the arena object is gone, its memory is not
  CHECK(torch::equal(b, torch::full({5}, 1.5, torch::kBFloat16)));
}

TEST_CASE("the weight arena asks the kernel for huge pages", "[model][can-skip]") {
  if (!kernel_has_transparent_huge_pages()) {
    KVEVICT_SKIP("this kernel has no transparent huge pages (or no /sys)");
    return;
  }
  WeightArena arena(size_t{4} << 20);
  auto t = arena.empty({1 << 20}, torch::kFloat32).fill_(1);
  INFO(smaps_of(t.data_ptr()));
  CHECK(advised_huge_pages(t.data_ptr()));
}

TEST_CASE("a model on the CPU holds its weights in the arena, with the checkpoint's values", "[model]") {
  const std::string dir = test::data("models/stories260K-hf");
  auto model = Model::load(dir, test::model_options());
  const WeightStore store = WeightStore::open(dir);
  const torch::Tensor& embed = model->weight(Role::Embed);
  const torch::Tensor& down = model->weight(Role::DownWeight, 0);
  REQUIRE(embed.defined());
  REQUIRE(down.defined());
  CHECK(test::same_bits(embed, store.get("model.embed_tokens.weight", torch::kFloat32, torch::kCPU)));
  CHECK(test::same_bits(down, store.get("model.layers.0.mlp.down_proj.weight", torch::kFloat32, torch::kCPU)));
  CHECK(reinterpret_cast<uintptr_t>(down.data_ptr()) % 64 == 0);
  // One anonymous mapping holds both, not the checkpoint's file.
  const std::string mapping = smaps_of(embed.data_ptr());
  INFO(mapping);
  CHECK(mapping.substr(0, mapping.find('\n')) == smaps_of(down.data_ptr()).substr(0, mapping.find('\n')));
  CHECK(mapping.find("safetensors") == std::string::npos);
  if (kernel_has_transparent_huge_pages()) CHECK(advised_huge_pages(embed.data_ptr()));
}
