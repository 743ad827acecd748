// The version string every results row and `kvevict --version` carry.
#pragma once
#include <string>

namespace kvevict {

// "0.1.0+<commit>", with "-dirty" when tracked files had uncommitted changes at build time.
std::string kvevict_version();

}  // namespace kvevict
