// The driver's softmax over the slots a query sees (harness/runtime/slot_softmax.h),
// without a model: its bits against a plain per-slot loop in scalar code, the same bits whether the
// slots sit in column order (the vector path) or scattered, the sliding window and the
// pattern masks, float and double rows, and the fixed-lane sum against its scalar loop.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "harness/runtime/double_exp.h"
#include "harness/common/float_row_exp.h"
#include "harness/runtime/slot_softmax.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(n);
  for (float& x : row) x = normal(rng);
  return row;
}

// What slot_softmax computes, one slot at a time, in scalar code: a float row's
// exponentials in float from the float difference (exp_floats_scalar), a double row's in
// double (exp_doubles_scalar), the lane sum in double.
struct Reference {
  std::vector<float> row, out;
  int seen = 0;
};
double exp_of_difference(float x, float m) {
  const float d = x - m;
  float e = 0.0f;
  exp_floats_scalar(&d, &e, 1);
  return e;
}
double exp_of_difference(double x, double m) {
  const double d = x - m;
  double e = 0.0;
  exp_doubles_scalar(&d, &e, 1);
  return e;
}
template <typename Scalar>
Reference reference(const std::vector<Scalar>& logits, const SlotRow& at) {
  const int slots = at.slots;
  auto is_seen = [&](int s) { return at.positions[s] >= at.oldest && (!at.vis || at.vis[s]); };
  Scalar m = -std::numeric_limits<Scalar>::infinity();
  for (int s = 0; s < slots; ++s)
    if (is_seen(s)) m = std::max(m, logits[at.columns[s]]);
  std::vector<double> e(slots, 0.0);
  Reference ref;
  for (int s = 0; s < slots; ++s)
    if (is_seen(s)) {
      e[s] = exp_of_difference(logits[at.columns[s]], m);
      ++ref.seen;
    }
  const double inv = 1.0 / lane_sum_scalar(e.data(), slots);
  ref.out.resize(slots);
  ref.row.assign(logits.size(), 0.0f);
  for (int s = 0; s < slots; ++s) {
    ref.out[s] = static_cast<float>(e[s] * inv);
    ref.row[at.columns[s]] = ref.out[s];
  }
  return ref;
}

struct Result {
  std::vector<float> row, out;
  int seen = 0;
};
Result run(std::vector<float> row, const SlotRow& at) {
  Result r;
  std::vector<double> exps(at.slots);
  r.out.assign(at.slots, -1.0f);
  r.seen = slot_softmax(row.data(), static_cast<int64_t>(row.size()), at, exps.data(), r.out.data());
  r.row = row;
  return r;
}

// Slots 0 .. slots-1 at positions and columns 0 .. slots-1, all seen (no window, no
// pattern). `order` holds the positions and columns the row points at.
SlotRow in_order_slots(int slots, std::vector<int>* order) {
  order->resize(slots);
  std::iota(order->begin(), order->end(), 0);
  SlotRow at;
  at.positions = order->data();
  at.columns = order->data();
  at.slots = slots;
  at.oldest = std::numeric_limits<int64_t>::min();
  return at;
}

}  // namespace

TEST_CASE("the lane sum: the vector loop has the scalar loop's bits", "[runtime][slot-softmax]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  for (int n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 100, 1023, 8193}) {
    std::vector<double> x(n);
    for (double& v : x) v = share(rng) * std::pow(2.0, static_cast<int>(share(rng) * 60) - 30);
    const double vector = lane_sum(x.data(), n), scalar = lane_sum_scalar(x.data(), n);
    CHECK(std::memcmp(&vector, &scalar, sizeof vector) == 0);
    double plain = 0;
    for (double v : x) plain += v;
    CHECK(std::abs(vector - plain) <= 1e-12 * std::abs(plain));
  }
  // Lane j holds slots j, j + 8, ...: the order is the documented one, not another.
  // 1e17 absorbs each 6 added to it alone (its spacing is 16), not the other lanes' 12s.
  std::vector<double> x(kSumLanes * 2, 6.0);
  x[0] = 1e17;
  double acc[kSumLanes] = {};
  for (size_t s = 0; s < x.size(); ++s) acc[s % kSumLanes] += x[s];
  const double expected = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  CHECK(lane_sum(x.data(), static_cast<int>(x.size())) == expected);
  double in_slot_order = 0;
  for (double v : x) in_slot_order += v;
  CHECK(in_slot_order != expected);  // so the check above tells the orders apart
}

TEST_CASE("slot softmax: every slot seen, in column order", "[runtime][slot-softmax]") {
  for (int slots : {1, 2, 5, 8, 33, 1000, 4099}) {
    const int n = slots + 7;  // columns past the slots (a causal block's later keys) become 0
    const auto logits = random_logits(n, static_cast<uint32_t>(slots));
    std::vector<int> order;
    const SlotRow at = in_order_slots(slots, &order);
    const Result got = run(logits, at);
    const Reference want = reference(logits, at);
    CHECK(got.seen == slots);
    CHECK(same_bits(got.out, want.out));
    CHECK(same_bits(got.row, want.row));
    double total = 0;
    for (float p : got.out) total += p;
    CHECK(std::abs(total - 1.0) < 1e-5);
  }
}

TEST_CASE("slot softmax: scattered columns give the in-order bits", "[runtime][slot-softmax]") {
  // The same logits reach the slots through scattered columns, some past the slot count
  // (a decode cache's rows after evictions, sim mode's positions), and in order: each
  // slot's share is the same.
  const int slots = 777, n = 1200;
  const auto in_order = random_logits(n, 11);
  std::vector<int> positions(slots), identity(slots), shuffled(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(identity.begin(), identity.end(), 0);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  shuffled.resize(slots);
  std::vector<float> scattered(n, 1e30f);  // columns no slot names: overwritten with 0
  for (int s = 0; s < slots; ++s) scattered[shuffled[s]] = in_order[s];
  SlotRow at;
  at.positions = positions.data();
  at.slots = slots;
  at.oldest = std::numeric_limits<int64_t>::min();
  at.columns = identity.data();
  const Result a = run(in_order, at);
  at.columns = shuffled.data();
  const Result b = run(scattered, at);
  CHECK(same_bits(a.out, b.out));
  CHECK(same_bits(b.row, reference(scattered, at).row));
  for (int s = 0; s < slots; ++s) CHECK(b.row[shuffled[s]] == a.row[s]);
  std::vector<char> named(n, 0);
  for (int c : shuffled) named[c] = 1;
  int zeros = 0;
  for (int c = 0; c < n; ++c) zeros += !named[c] && b.row[c] == 0.0f;
  CHECK(zeros == n - slots);
}

TEST_CASE("slot softmax: the sliding window and the pattern hide slots", "[runtime][slot-softmax]") {
  const int slots = 301, n = 320;
  const auto logits = random_logits(n, 21);
  std::vector<int> positions(slots), columns(slots);
  for (int s = 0; s < slots; ++s) positions[s] = 2 * s;  // kept positions, oldest first
  std::iota(columns.begin(), columns.end(), 0);
  std::vector<char> vis(slots);
  for (int s = 0; s < slots; ++s) vis[s] = s % 3 != 1;
  SlotRow at;
  at.positions = positions.data();
  at.columns = columns.data();
  at.slots = slots;
  SECTION("window") {
    at.oldest = 100;  // positions 0 .. 98 (slots 0 .. 49) are out of it
    const Result got = run(logits, at);
    CHECK(got.seen == slots - 50);
    CHECK(same_bits(got.out, reference(logits, at).out));
    CHECK(same_bits(got.row, reference(logits, at).row));
    for (int s = 0; s < 50; ++s) CHECK(got.out[s] == 0.0f);
    CHECK(got.out[50] > 0.0f);
  }
  SECTION("pattern and window") {
    at.oldest = 100;
    at.vis = vis.data();
    const Result got = run(logits, at);
    int expected = 0;
    for (int s = 50; s < slots; ++s) expected += vis[s];
    CHECK(got.seen == expected);
    CHECK(same_bits(got.out, reference(logits, at).out));
    for (int s = 0; s < slots; ++s) CHECK((got.out[s] > 0.0f) == (s >= 50 && vis[s]));
  }
}

TEST_CASE("slot softmax: double rows", "[runtime][slot-softmax]") {
  const int slots = 130, n = 131;
  const auto floats = random_logits(n, 31);
  std::vector<double> row(floats.begin(), floats.end());
  std::vector<int> order;
  const SlotRow at = in_order_slots(slots, &order);
  std::vector<double> exps(slots);
  std::vector<float> out(slots);
  CHECK(slot_softmax(row.data(), n, at, exps.data(), out.data()) == slots);
  const Reference want = reference(std::vector<double>(floats.begin(), floats.end()), at);
  CHECK(same_bits(out, want.out));
  double total = 0;
  for (int s = 0; s < slots; ++s) total += row[s];
  CHECK(std::abs(total - 1.0) < 1e-12);
  CHECK(row[n - 1] == 0.0);
  // The row holds the double shares, the floats their roundings.
  for (int s = 0; s < slots; ++s) CHECK(static_cast<float>(row[s]) == out[s]);
}
