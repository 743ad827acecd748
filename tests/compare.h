// The one way the tests compare vectors of numbers (log-probs, scores, logits).
// std::max(worst, |a - b|) keeps `worst` when the difference is NaN, so a NaN output
// would pass any "max difference < tolerance" check; max_diff() refuses it instead.
#pragma once
#include <cmath>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvevict::test {

// The largest |a[i] - b[i]|. Throws (so the CHECK around the call fails, with this
// message) when the sizes differ or when either side holds a NaN or an infinity; the
// message names the first such index and both values.
inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    std::ostringstream message;
    message << "max_diff: sizes differ (" << a.size() << " and " << b.size() << ")";
    throw std::invalid_argument(message.str());
  }
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      std::ostringstream message;
      message << "max_diff: index " << i << " of " << a.size() << " is not finite (" << a[i] << " and " << b[i] << ")";
      throw std::domain_error(message.str());
    }
    const double diff = std::abs(a[i] - b[i]);
    if (diff > worst) worst = diff;
  }
  return worst;
}

}  // namespace kvevict::test
