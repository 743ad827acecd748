// A pickle reader that only builds data. It knows the opcodes and globals a
// torch.save'd state dict needs and refuses everything else by name, so nothing a
// pickle says is ever called: REDUCE is interpreted for two known callables only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict::pickle {

// A torch storage type as named by its global (torch.FloatStorage, ...).
struct StorageType {
  std::string global;       // "torch.FloatStorage"
  std::string dtype;        // safetensors-style name: "F32", "F16", "BF16", "U8", ...; "" = unsupported
  size_t element_size = 0;
};

// ('storage', torch.XStorage, key, location, numel) from a persistent id.
struct StorageRef {
  StorageType type;
  std::string key;
  std::string location;
  int64_t numel = 0;
};

// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, ...).
struct TensorRef {
  StorageRef storage;
  int64_t storage_offset = 0;
  std::vector<int64_t> size, stride;
};

enum class Kind { None, Bool, Int, BigInt, Float, String, Tuple, List, Dict, Global, Storage, Tensor };
const char* kind_name(Kind kind);

enum class Callable { NotCallable, OrderedDict, RebuildTensorV2 };

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// How deep lists, dicts and tuples may nest in a pickle. Python's pickler recurses once
// per level and stops near its recursion limit of 1000, so no pickle it wrote nests
// deeper; a state dict nests about 4 levels.
constexpr int kMaxPickleNesting = 1000;

struct Value {
  Kind kind = Kind::None;
  int nesting = 0;         // containers inside containers below this value (0: holds none)
  bool contained = false;  // already an item of a list, dict or tuple
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // String; Global's dotted name; BigInt's little-endian bytes
  std::vector<ValuePtr> items;                           // Tuple, List
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;    // Dict, in insertion order
  std::unordered_map<std::string, size_t> string_keys;   // Dict: string key -> its entry
  Callable callable = Callable::NotCallable;             // Global
  StorageType storage_type;                              // Global naming a storage type
  StorageRef storage;                                    // Storage
  TensorRef tensor;                                      // Tensor
};

// Thrown (as a kvevict::Error) when a pickle runs past the end of its data.
struct TruncatedPickle : Error {
  using Error::Error;
};

struct Unpickled {
  ValuePtr value;
  size_t end = 0;  // offset just past the STOP opcode
};

// Reads one pickle starting at data[start]. `source` names the file (and record) in
// errors. Throws kvevict::Error "SOURCE: ..." for any opcode or global outside the
// allowed set or malformed arguments; TruncatedPickle for a pickle running past `size`.
Unpickled unpickle(const uint8_t* data, size_t size, size_t start, const std::string& source);

}  // namespace kvevict::pickle
