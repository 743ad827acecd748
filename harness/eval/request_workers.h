// Whole requests of one evaluation run on several threads at once when the model runs
// each op on one thread (Model::request_workers()): every request is computed exactly as
// it is alone (the same ops, shapes and single-threaded kernels), so no number changes;
// only the order in which requests finish does, and callers keep results in their slots.
#pragma once
#include <functional>

namespace kvevict {

// Runs body(i) for every i in [0, count), up to `workers` at once, in increasing i as
// threads become free. finished(done) is called after each body returns, one call at a
// time, with done = 1, 2, .., count. An exception from a body stops bodies not yet started
// and is rethrown here: the one of the lowest i, which is the one a serial loop meets
// first (every lower i had started, and runs to its end).
void for_each_request(int count, int workers, const std::function<void(int)>& body,
                      const std::function<void(int)>& finished);

}  // namespace kvevict
