// One table per enum gives both directions of its name, and an error for an unknown name
// that lists the allowed ones: parse_enum(kModeNames, "mode", "sim"), enum_name(kModeNames,
// Mode::Sim). A value may have several names (aliases); the first one is its name.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict {

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

// "a, b or c": the first name of each value, in table order.
template <typename Enum, std::size_t N>
std::string enum_name_list(const EnumName<Enum> (&table)[N]) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < N; ++i) {
    bool alias = false;
    for (std::size_t j = 0; j < i; ++j) alias |= table[j].value == table[i].value;
    if (!alias) names.push_back(table[i].name);
  }
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return list;
}

// Throws kvevict::Error "unknown WHAT \"NAME\" (use a, b or c)".
template <typename Enum, std::size_t N>
Enum parse_enum(const EnumName<Enum> (&table)[N], const std::string& what,
                const std::string& name) {
  for (const auto& entry : table)
    if (name == entry.name) return entry.value;
  throw Error("unknown " + what + " \"" + name + "\" (use " + enum_name_list(table) + ")");
}

template <typename Enum, std::size_t N>
std::string enum_name(const EnumName<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  throw Error("enum value without a name (" + std::to_string(static_cast<long long>(value)) + ")");
}

}  // namespace kvevict
