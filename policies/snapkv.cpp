#include "policies/snapkv.h"

#include "harness/common/errors.h"

namespace kvevict {

std::unique_ptr<Policy> make_snapkv_policy(const PolicyOptions& o) {
  if (o.window < 1) throw Error("snapkv: --window must be at least 1");
  if (o.pooling != "avg" && o.pooling != "max")
    throw Error("snapkv: --pooling must be avg or max, not " + o.pooling);
  return std::make_unique<SnapKVPolicy>(o);
}

}  // namespace kvevict
