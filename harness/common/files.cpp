#include "harness/common/files.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "harness/common/errors.h"

namespace kvevict {

std::string json_error_message(const std::exception& error) {
  std::string message = error.what();
  if (message.rfind("[json.exception.", 0) == 0) {
    const size_t end = message.find("] ");
    if (end != std::string::npos) message.erase(0, end + 2);
  }
  return message;
}

std::string read_text_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

namespace {

// Builds the document from the parser's SAX events, as the JSON library's own builder
// does, except that a key already in its object is an error: the object's map says so at
// the insertion that would have overwritten it, so the check costs no extra lookup.
class StrictJsonBuilder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit StrictJsonBuilder(const std::string& where) : where_(where) {}
  nlohmann::json& result() { return root_; }

  bool null() override { return add(nullptr); }
  bool boolean(bool value) override { return add(value); }
  bool number_integer(number_integer_t value) override { return add(value); }
  bool number_unsigned(number_unsigned_t value) override { return add(value); }
  bool number_float(number_float_t value, const string_t&) override { return add(value); }
  bool string(string_t& value) override { return add(std::move(value)); }
  bool binary(binary_t& value) override { return add(nlohmann::json::binary(std::move(value))); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    Open& object = open_.back();
    auto [entry, fresh] = object.value->get_ref<nlohmann::json::object_t&>().emplace(std::move(key), nullptr);
    if (!fresh) throw Error(where_ + ": key \"" + entry->first + "\" appears twice in " + open_path());
    object.key = &entry->first;
    next_ = &entry->second;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) override {
    throw Error(where_ + ": malformed JSON: " + json_error_message(error));
  }

 private:
  struct Open {
    nlohmann::json* value;
    const std::string* key;  // objects: the key being read
  };

  // Where the next value goes: the document, the slot a key made, or the end of an array.
  nlohmann::json* place(nlohmann::json&& value) {
    if (open_.empty()) return &(root_ = std::move(value));
    nlohmann::json& parent = *open_.back().value;
    if (parent.is_array()) {
      parent.get_ref<nlohmann::json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<nlohmann::json::array_t&>().back();
    }
    return &(*next_ = std::move(value));
  }
  bool add(nlohmann::json&& value) {
    place(std::move(value));
    return true;
  }
  bool open(nlohmann::json&& container) {
    open_.push_back({place(std::move(container)), nullptr});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  // The innermost open object as a path: "the top-level object", "model.vocab", "added_tokens[3]".
  std::string open_path() const {
    std::string path;
    for (size_t i = 0; i + 1 < open_.size(); ++i) {
      if (open_[i].value->is_object())
        path += (path.empty() ? "" : ".") + *open_[i].key;
      else
        path += "[" + std::to_string(open_[i].value->size() - 1) + "]";
    }
    return path.empty() ? "the top-level object" : path;
  }

  const std::string& where_;
  nlohmann::json root_;
  std::vector<Open> open_;
  nlohmann::json* next_ = nullptr;
};

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  StrictJsonBuilder builder(where);
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const nlohmann::json::exception& e) {  // out_of_range for a number too large, ...
    throw Error(where + ": malformed JSON: " + json_error_message(e));
  }
  return std::move(builder.result());
}

nlohmann::json read_json_file(const std::string& path) { return parse_json(read_text_file(path), path); }

std::vector<int> read_tokens_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a file");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open file");
  std::vector<int> ids;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      try {
        size_t used = 0;
        int id = std::stoi(word, &used);
        if (used != word.size() || id < 0) throw std::invalid_argument(word);
        ids.push_back(id);
      } catch (const std::exception&) {
        throw Error(path + ":" + std::to_string(line_no) + ": \"" + word + "\" is not a token id");
      }
    }
  }
  return ids;
}


long long json_int(const nlohmann::json& v, const std::string& where, const std::string& key, long long low,
                   long long high) {
  if (!v.is_number_integer())
    throw Error(where + ": key \"" + key + "\" has the wrong type (an integer is needed, not " + v.dump() + ")");
  // Non-negative integers are stored unsigned and may exceed long long.
  const bool fits = v.is_number_unsigned()
                        ? high >= 0 && v.get<unsigned long long>() <= static_cast<unsigned long long>(high) &&
                              (low <= 0 || v.get<unsigned long long>() >= static_cast<unsigned long long>(low))
                        : v.get<long long>() >= low && v.get<long long>() <= high;
  if (!fits)
    throw Error(where + ": key \"" + key + "\": " + v.dump() + " is outside [" + std::to_string(low) + ", " +
                std::to_string(high) + "]");
  return v.get<long long>();
}

std::uint64_t parse_seed(const std::string& text, const std::string& name) {
  const std::string rule = " must be an unsigned 64-bit integer, 0 to 18446744073709551615";
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(name + " " + text + rule);
  std::uint64_t value = 0;
  for (char c : text) {
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) throw Error(name + " " + text + rule + " (it overflows)");
    value = value * 10 + digit;
  }
  return value;
}

std::uint64_t json_seed(const nlohmann::json& v, const std::string& where, const std::string& key) {
  // The JSON library reads a number past 2^64 - 1 as a float: refused with the fractions.
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0))
    throw Error(where + ": key \"" + key + "\": " + v.dump() +
                " is not a seed (an unsigned 64-bit integer, 0 to 18446744073709551615)");
  return v.get<std::uint64_t>();
}

bool remove_tree(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return errno == ENOENT;
  // Depth first, so that a folder is empty when its turn comes; one that cannot be
  // removed leaves the rest to be tried.
  auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    ::remove(entry);
    return 0;
  };
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ::lstat(path.c_str(), &info) != 0 && errno == ENOENT;
}

}  // namespace kvevict
