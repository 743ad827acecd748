#include "policies/snapkv.h"

namespace kvevict {

std::unique_ptr<Policy> make_snapkv_policy(const PolicyOptions& o) {
  return std::make_unique<SnapKVPolicy>(o);
}

}  // namespace kvevict
