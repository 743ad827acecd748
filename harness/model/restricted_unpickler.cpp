#include "harness/model/restricted_unpickler.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_set>

#include "harness/common/errors.h"

namespace kvevict::pickle {
namespace {

// Every pickle opcode by name, so that a refusal says what it refused.
const char* opcode_name(uint8_t op) {
  static const std::map<uint8_t, const char*> names = {
      {'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"},
      {'F', "FLOAT"}, {'I', "INT"}, {'J', "BININT"}, {'K', "BININT1"}, {'L', "LONG"},
      {'M', "BININT2"}, {'N', "NONE"}, {'P', "PERSID"}, {'Q', "BINPERSID"}, {'R', "REDUCE"},
      {'S', "STRING"}, {'T', "BINSTRING"}, {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"},
      {'X', "BINUNICODE"}, {'a', "APPEND"}, {'b', "BUILD"}, {'c', "GLOBAL"}, {'d', "DICT"},
      {'}', "EMPTY_DICT"}, {'e', "APPENDS"}, {'g', "GET"}, {'h', "BINGET"}, {'i', "INST"},
      {'j', "LONG_BINGET"}, {'l', "LIST"}, {']', "EMPTY_LIST"}, {'o', "OBJ"}, {'p', "PUT"},
      {'q', "BINPUT"}, {'r', "LONG_BINPUT"}, {'s', "SETITEM"}, {'t', "TUPLE"},
      {')', "EMPTY_TUPLE"}, {'u', "SETITEMS"}, {'G', "BINFLOAT"}, {0x80, "PROTO"},
      {0x81, "NEWOBJ"}, {0x82, "EXT1"}, {0x83, "EXT2"}, {0x84, "EXT4"}, {0x85, "TUPLE1"},
      {0x86, "TUPLE2"}, {0x87, "TUPLE3"}, {0x88, "NEWTRUE"}, {0x89, "NEWFALSE"},
      {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'B', "BINBYTES"}, {'C', "SHORT_BINBYTES"},
      {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"}, {0x8e, "BINBYTES8"},
      {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x92, "NEWOBJ_EX"},
      {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"}, {0x95, "FRAME"}, {0x96, "BYTEARRAY8"},
      {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}};
  auto it = names.find(op);
  return it == names.end() ? "unknown" : it->second;
}

// The storage classes torch.save names. The ones without a dtype are known but not
// loadable (complex and quantized); a tensor on one is refused by name.
const std::map<std::string, StorageType>& storage_types() {
  static const std::map<std::string, StorageType> table = [] {
    std::map<std::string, StorageType> t;
    auto add = [&](const std::string& global, const std::string& dtype, size_t bytes) {
      t[global] = StorageType{global, dtype, bytes};
    };
    add("torch.FloatStorage", "F32", 4);
    add("torch.HalfStorage", "F16", 2);
    add("torch.BFloat16Storage", "BF16", 2);
    add("torch.DoubleStorage", "F64", 8);
    add("torch.LongStorage", "I64", 8);
    add("torch.IntStorage", "I32", 4);
    add("torch.ShortStorage", "I16", 2);
    add("torch.CharStorage", "I8", 1);
    add("torch.ByteStorage", "U8", 1);
    add("torch.BoolStorage", "BOOL", 1);
    add("torch.UntypedStorage", "U8", 1);
    add("torch.storage.UntypedStorage", "U8", 1);
    for (const char* name : {"ComplexFloatStorage", "ComplexDoubleStorage", "QInt8Storage", "QUInt8Storage",
                             "QInt32Storage", "QUInt4x2Storage", "QUInt2x4Storage"})
      add(std::string("torch.") + name, "", 0);
    return t;
  }();
  return table;
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, size_t start, const std::string& source)
      : data_(data), size_(size), pos_(start), source_(source) {}

  Unpickled run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(source_ + ": pickle byte " + std::to_string(op_pos_) + ": " + what);
  }
  const uint8_t* take(size_t n) {
    if (n > size_ - pos_)
      throw TruncatedPickle(source_ + ": pickle byte " + std::to_string(op_pos_) + ": " + opcode_name(op_) +
                            " runs past the end of the data; the pickle is truncated");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint64_t little(size_t n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  std::string line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (!nl)
      throw TruncatedPickle(source_ + ": pickle byte " + std::to_string(op_pos_) +
                            ": GLOBAL without a newline; the pickle is truncated");
    size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
    std::string s(reinterpret_cast<const char*>(take(n)), n);
    take(1);
    return s;
  }
  ValuePtr make(Kind kind) {
    auto v = std::make_shared<Value>();
    v->kind = kind;
    if (kind == Kind::List || kind == Kind::Dict || kind == Kind::Tuple) v->nesting = 1;
    return v;
  }
  // Notes that `item` is now held by `container`, and how deep that nests.
  void adopt(Value& container, Value& item) {
    item.contained = true;
    container.nesting = std::max(container.nesting, item.nesting + 1);
    if (container.nesting > kMaxPickleNesting)
      fail(std::string(opcode_name(op_)) + " nests lists, dicts and tuples more than " +
           std::to_string(kMaxPickleNesting) + " levels deep; a state dict nests a few");
  }
  ValuePtr make_tuple(std::vector<ValuePtr> items) {
    auto v = make(Kind::Tuple);
    for (const auto& item : items) adopt(*v, *item);
    v->items = std::move(items);
    return v;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail(std::string(opcode_name(op_)) + " on an empty stack");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail(std::string(opcode_name(op_)) + " on an empty stack");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_to_mark() {
    if (marks_.empty()) fail(std::string(opcode_name(op_)) + " without a MARK");
    size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  ValuePtr memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail("memo entry " + std::to_string(index) + " was never stored");
    return it->second;
  }
  ValuePtr global(const std::string& module, const std::string& name);
  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args);
  ValuePtr persistent_load(const ValuePtr& pid);
  void set_items(const ValuePtr& dict, const std::vector<ValuePtr>& kv);
  void refuse_cycle(const ValuePtr& container, const std::vector<ValuePtr>& added) const;
  static std::vector<int64_t> int_tuple(const ValuePtr& v, bool* ok);
  ValuePtr read_literal();
  [[noreturn]] void refuse_opcode() const;

  const uint8_t* data_;
  size_t size_, pos_;
  const std::string& source_;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
};

ValuePtr Reader::global(const std::string& module, const std::string& name) {
  const std::string dotted = module + "." + name;
  auto v = make(Kind::Global);
  v->text = dotted;
  if (dotted == "collections.OrderedDict") {
    v->callable = Callable::OrderedDict;
  } else if (dotted == "torch._utils._rebuild_tensor_v2") {
    v->callable = Callable::RebuildTensorV2;
  } else if (auto it = storage_types().find(dotted); it != storage_types().end()) {
    v->storage_type = it->second;
  } else {
    fail("global " + dotted +
         " is not allowed: a state dict needs only collections.OrderedDict, "
         "torch._utils._rebuild_tensor_v2 and torch storage types; refusing the file (nothing was executed)");
  }
  return v;
}

std::vector<int64_t> Reader::int_tuple(const ValuePtr& v, bool* ok) {
  std::vector<int64_t> out;
  if (v->kind != Kind::Tuple) {
    *ok = false;
    return out;
  }
  for (auto& item : v->items) {
    if (item->kind != Kind::Int) *ok = false;
    out.push_back(item->integer);
  }
  return out;
}

ValuePtr Reader::reduce(const ValuePtr& callable, const ValuePtr& args) {
  if (callable->kind != Kind::Global || callable->callable == Callable::NotCallable)
    fail("REDUCE may only call collections.OrderedDict or torch._utils._rebuild_tensor_v2, not " +
         (callable->kind == Kind::Global ? callable->text : std::string("a ") + kind_name(callable->kind)));
  if (args->kind != Kind::Tuple) fail("REDUCE arguments of " + callable->text + " are not a tuple");
  if (callable->callable == Callable::OrderedDict) {
    if (!args->items.empty()) fail("collections.OrderedDict called with arguments; only OrderedDict() is allowed");
    return make(Kind::Dict);
  }
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  const auto& a = args->items;
  if (a.size() != 6 && a.size() != 7) fail("_rebuild_tensor_v2 takes 6 or 7 arguments, got " + std::to_string(a.size()));
  if (a[0]->kind != Kind::Storage) fail(std::string("_rebuild_tensor_v2: argument 1 is a ") + kind_name(a[0]->kind) + ", not a storage");
  if (a[1]->kind != Kind::Int) fail("_rebuild_tensor_v2: the storage offset is not an integer");
  bool ok = true;
  auto v = make(Kind::Tensor);
  v->tensor.storage = a[0]->storage;
  v->tensor.storage_offset = a[1]->integer;
  v->tensor.size = int_tuple(a[2], &ok);
  v->tensor.stride = int_tuple(a[3], &ok);
  if (!ok || v->tensor.size.size() != v->tensor.stride.size())
    fail("_rebuild_tensor_v2: size and stride must be tuples of integers of equal length");
  if (a[4]->kind != Kind::Bool) fail("_rebuild_tensor_v2: requires_grad is not a bool");
  if (a[5]->kind != Kind::Dict || !a[5]->entries.empty())
    fail("_rebuild_tensor_v2: backward hooks must be an empty OrderedDict");
  return v;
}

ValuePtr Reader::persistent_load(const ValuePtr& pid) {
  // ('storage', storage_type, key, location, numel), plus view metadata (None) in the
  // legacy format.
  const auto& t = pid->items;
  if (pid->kind != Kind::Tuple || t.size() < 5 || t.size() > 6 || t[0]->kind != Kind::String ||
      t[0]->text != "storage")
    fail("persistent id is not ('storage', type, key, location, numel)");
  if (t[1]->kind != Kind::Global || t[1]->storage_type.global.empty())
    fail("persistent id names no torch storage type");
  if (t[2]->kind != Kind::String || t[3]->kind != Kind::String || t[4]->kind != Kind::Int || t[4]->integer < 0)
    fail("persistent id for a storage has a malformed key, location or element count");
  if (t.size() == 6 && t[5]->kind != Kind::None)
    fail("storage " + t[2]->text + " is a view of another storage (torch < 0.4 format); re-save it with a modern torch");
  auto v = make(Kind::Storage);
  v->storage.type = t[1]->storage_type;
  v->storage.key = t[2]->text;
  v->storage.location = t[3]->text;
  v->storage.numel = t[4]->integer;
  return v;
}

// Whether `root` is `target` or holds it at any depth (each value visited once).
bool reaches(const ValuePtr& root, const Value* target) {
  std::vector<const Value*> todo{root.get()};
  std::unordered_set<const Value*> seen;
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    if (v == target) return true;
    if (!seen.insert(v).second) continue;
    for (const auto& item : v->items) todo.push_back(item.get());
    for (const auto& [key, value] : v->entries) {
      todo.push_back(key.get());
      todo.push_back(value.get());
    }
  }
  return false;
}

// A list or dict that came to hold itself (the memo makes that two opcodes) would be a
// shared_ptr cycle that is never freed (fuzz_pytorch_bin found it); a state dict never
// holds one, so it is refused. Python's pickler fills a container before it puts it into
// another, unless the container holds itself, so a cycle needs either the container as its
// own item or a container changed after it went into another: two O(1) checks, which keep
// the reader linear in the file (a search for the container under every added value was
// quadratic in the nesting). The search runs once, only to word the refusal.
void Reader::refuse_cycle(const ValuePtr& container, const std::vector<ValuePtr>& added) const {
  bool cycle = false;
  for (const auto& value : added) cycle = cycle || value == container;
  if (!cycle && !container->contained) return;
  for (const auto& value : added) cycle = cycle || reaches(value, container.get());
  if (cycle)
    fail(std::string(opcode_name(op_)) + " would put a " + kind_name(container->kind) +
         " inside itself (a reference cycle); a state dict holds none");
  fail(std::string(opcode_name(op_)) + " would change a " + kind_name(container->kind) +
       " that is already inside another container; Python's pickler never does, a state dict has no use for it");
}

void Reader::set_items(const ValuePtr& dict, const std::vector<ValuePtr>& kv) {
  if (dict->kind != Kind::Dict) fail(std::string("SETITEM(S) on a ") + kind_name(dict->kind) + ", not a dict");
  if (kv.size() % 2) fail("SETITEMS with an odd number of items");
  refuse_cycle(dict, kv);
  for (size_t i = 0; i < kv.size(); i += 2) {
    adopt(*dict, *kv[i]);
    adopt(*dict, *kv[i + 1]);
    // A string key given again replaces its value, as in Python (other keys compare by identity).
    if (kv[i]->kind == Kind::String) {
      const auto [it, fresh] = dict->string_keys.emplace(kv[i]->text, dict->entries.size());
      if (!fresh) {
        dict->entries[it->second].second = kv[i + 1];
        continue;
      }
    }
    dict->entries.emplace_back(kv[i], kv[i + 1]);
  }
}

// A value written inline after its opcode: a bool, an int (BININT, BININT1, BININT2,
// LONG1), a BINFLOAT or a string (BINUNICODE, SHORT_BINUNICODE, BINUNICODE8).
ValuePtr Reader::read_literal() {
  switch (op_) {
    case 0x88: case 0x89: {
      auto v = make(Kind::Bool);
      v->boolean = op_ == 0x88;
      return v;
    }
    case 'J': case 'K': case 'M': {
      auto v = make(Kind::Int);
      if (op_ == 'J') v->integer = static_cast<int32_t>(little(4));
      else v->integer = static_cast<int64_t>(little(op_ == 'K' ? 1 : 2));
      return v;
    }
    case 0x8a: {  // LONG1: a signed little-endian integer of n bytes
      size_t n = *take(1);
      const uint8_t* p = take(n);
      if (n <= 8) {
        uint64_t raw = 0;
        for (size_t i = n; i-- > 0;) raw = (raw << 8) | p[i];
        if (n > 0 && n < 8 && (p[n - 1] & 0x80)) raw |= ~uint64_t{0} << (8 * n);  // sign-extend
        auto v = make(Kind::Int);
        v->integer = static_cast<int64_t>(raw);
        return v;
      } else {
        auto v = make(Kind::BigInt);
        v->text.assign(reinterpret_cast<const char*>(p), n);
        return v;
      }
    }
    case 'G': {  // BINFLOAT, big-endian
      const uint8_t* p = take(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
      auto v = make(Kind::Float);
      std::memcpy(&v->real, &bits, 8);
      return v;
    }
    default: {  // 'X', 0x8c, 0x8d
      size_t n = static_cast<size_t>(little(op_ == 'X' ? 4 : op_ == 0x8c ? 1 : 8));
      const uint8_t* p = take(n);
      auto v = make(Kind::String);
      v->text.assign(reinterpret_cast<const char*>(p), n);
      return v;
    }
  }
}

[[noreturn]] void Reader::refuse_opcode() const {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", op_);
  fail(std::string("opcode ") + opcode_name(op_) + " (" + hex +
       ") is not allowed in a state dict; refusing the file (nothing was executed)");
}

Unpickled Reader::run() {
  while (true) {
    op_pos_ = pos_;
    op_ = *take(1);
    switch (op_) {
      case 0x80: {  // PROTO
        uint8_t version = *take(1);
        if (version < 2 || version > 5) fail("pickle protocol " + std::to_string(version) + " is not supported");
        break;
      }
      case 0x95: take(8); break;  // FRAME: a length hint only
      case '.': {  // STOP
        if (!marks_.empty() || stack_.size() != 1) fail("STOP with an unbalanced stack");
        return {stack_.back(), pos_};
      }
      case '(': marks_.push_back(stack_.size()); break;
      case '}': push(make(Kind::Dict)); break;
      case ']': push(make(Kind::List)); break;
      case ')': push(make(Kind::Tuple)); break;
      case 'N': push(make(Kind::None)); break;
      case 0x88: case 0x89: case 'J': case 'K': case 'M': case 0x8a: case 'G': case 'X': case 0x8c: case 0x8d:
        push(read_literal());
        break;
      case 'c': {
        std::string module = line();
        std::string name = line();
        push(global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        ValuePtr name = pop(), module = pop();
        if (name->kind != Kind::String || module->kind != Kind::String) fail("STACK_GLOBAL needs two strings");
        push(global(module->text, name->text));
        break;
      }
      case 'Q': push(persistent_load(pop())); break;
      case 't': push(make_tuple(pop_to_mark())); break;
      case 0x85: case 0x86: case 0x87: {
        std::vector<ValuePtr> items(op_ - 0x84u);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(make_tuple(std::move(items)));
        break;
      }
      case 'h': push(memo_get(little(1))); break;
      case 'j': push(memo_get(little(4))); break;
      case 'q': memo_put(little(1)); break;
      case 'r': memo_put(little(4)); break;
      case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
      case 'R': {
        ValuePtr args = pop();
        ValuePtr callable = pop();
        push(reduce(callable, args));
        break;
      }
      case 'b': {  // BUILD: only the instance dict of an OrderedDict (its _metadata), ignored
        ValuePtr state = pop();
        if (top()->kind != Kind::Dict || (state->kind != Kind::Dict && state->kind != Kind::None))
          fail(std::string("BUILD on a ") + kind_name(top()->kind) + "; only an OrderedDict's attributes may be set");
        break;
      }
      case 's': {
        ValuePtr value = pop(), key = pop();
        set_items(top(), {key, value});
        break;
      }
      case 'u': {
        auto kv = pop_to_mark();
        set_items(top(), kv);
        break;
      }
      case 'a': {
        ValuePtr value = pop();
        if (top()->kind != Kind::List) fail("APPEND to a non-list");
        refuse_cycle(top(), {value});
        adopt(*top(), *value);
        top()->items.push_back(value);
        break;
      }
      case 'e': {
        auto values = pop_to_mark();
        if (top()->kind != Kind::List) fail("APPENDS to a non-list");
        refuse_cycle(top(), values);
        for (const auto& value : values) adopt(*top(), *value);
        top()->items.insert(top()->items.end(), values.begin(), values.end());
        break;
      }
      default:
        refuse_opcode();
    }
  }
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "value";
}

Unpickled unpickle(const uint8_t* data, size_t size, size_t start, const std::string& source) {
  if (start >= size) throw TruncatedPickle(source + ": no pickle at byte " + std::to_string(start) + "; the file is truncated");
  return Reader(data, size, start, source).run();
}

}  // namespace kvevict::pickle
