#include "harness/common/version.h"

#include "git_version.h"  // generated at build time: KVEVICT_GIT_SHA

namespace kvevict {

std::string kvevict_version() { return std::string(KVEVICT_VERSION) + "+" + KVEVICT_GIT_SHA; }

}  // namespace kvevict
