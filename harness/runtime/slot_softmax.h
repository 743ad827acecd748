// The policy driver's softmax of one query row over the slots it sees (policy_driver.h,
// step 3), with its passes over the slots vectorised where the CPU has AVX2. It runs once
// per query row, query head and layer: an 8192-token prefill under h2o takes 1.2 million
// of them, each over up to 8192 slots, and as a scalar loop it was a third of the
// prefill's attention time (perf).
//
// The bits do not depend on the CPU: the maximum is exact in any order, each exponential
// has the same bits on every CPU (a float row's in float, float_row_exp.h; a double row's
// in double, double_exp.h), and the sum of the exponentials runs in double, in kSumLanes
// fixed lanes (slot s in lane s mod kSumLanes, each lane in slot order), added up in one
// fixed tree, in the vector loop and in the scalar one alike.
#pragma once
#include <cstdint>

#include "harness/runtime/double_exp.h"
#include "harness/common/float_row_exp.h"

namespace kvevict {

// Lanes of the exponentials' sum (see above), as exp_row_differences adds a float row's.
constexpr int kSumLanes = kRowSumLanes;

// The slots of one KV head as a query sees them: slot s's key sits at column columns[s]
// of the logits row, and it is seen when positions[s] >= oldest (a sliding window) and
// vis is null or vis[s] is set (a policy's pattern).
struct SlotRow {
  const int* positions = nullptr;
  const int* columns = nullptr;
  int slots = 0;
  int64_t oldest = 0;
  const char* vis = nullptr;
};

// The softmax of the logits row `row` (n columns) over the slots `at` sees: the row
// becomes the attention in place (0 at every column but the seen slots'), and out[s] gets
// slot s's share as a float (0 when unseen), float(e_s * (1 / sum of e)) with e_s and the
// sum in double. exps: scratch of `at.slots` doubles.
// Returns the slots seen.
int slot_softmax(float* row, int64_t n, const SlotRow& at, double* exps, float* out);
int slot_softmax(double* row, int64_t n, const SlotRow& at, double* exps, float* out);

// The sum of x[0 .. n-1] in kSumLanes lanes, as slot_softmax adds its exponentials.
double lane_sum(const double* x, int n);
// The same in scalar code, for the tests: the vector loop must give its bits.
double lane_sum_scalar(const double* x, int n);

}  // namespace kvevict
