// Random: each token draws a seeded random score when it enters the cache; the
// lowest go first. Scores depend only on (seed, layer, head, position), so the
// two execution modes evict the same tokens.
#include "policies/policy.h"

namespace kvevict {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const ParamSpec kSeed = ParamSpec::seed("seed", "random: seed").flag("--policy-seed").per_run_seed();

class RandomPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "random"; }
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce, &kSeed}; }
  void on_append(HeadSlots& head, float* slot, int position, const NewToken&) const override {
    slot[0] = position_value(head.layer, head.kv_head, position);
  }
  float position_value(int layer, int kv_head, int position) const override {
    const uint64_t h = splitmix64(seed_ ^ splitmix64((uint64_t(layer) << 40) ^ (uint64_t(kv_head) << 32) ^
                                                     uint64_t(position)));
    return static_cast<float>(h >> 40) / static_cast<float>(1ULL << 24);
  }
  void score(const HeadSlots& head, float* out) const override {
    for (size_t s = 0; s < head.positions.size(); ++s) out[s] = head.values[s];
  }
  ScoreRecipe score_recipe() const override { return ScoreRecipe::PositionDraw; }

 private:
  const uint64_t seed_ = options_.params.seed(kSeed);
};
}  // namespace

std::unique_ptr<Policy> make_random_policy(const PolicyOptions& o) {
  return std::make_unique<RandomPolicy>(o);
}
}  // namespace kvevict
