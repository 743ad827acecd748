// PyramidKV's per-layer budgets: linear from the bottom layer to the top, and their mean
// is the requested budget (model-free: only the policy's budget arithmetic).
#include "tests/catch.h"

#include "policies/registry.h"

using namespace kvevict;

TEST_CASE("pyramidkv layer budgets decrease and average to the budget", "[policies][pyramidkv]") {
  struct Case { int length, layers, n_q, n_kv; double ratio, beta; };
  const Case cases[] = {{200, 5, 8, 4, 0.2, 20}, {200, 5, 8, 4, 0.5, 20}, {1000, 32, 32, 8, 0.1, 20},
                        {97, 12, 12, 12, 0.3, 5}, {512, 2, 4, 4, 0.15, 20}, {333, 7, 8, 2, 0.05, 3}};
  for (const Case& c : cases) {
    PolicyOptions options;
    options.budget.ratio = c.ratio;
    options.params.set("window", 4);
    options.params.set("pyramid_beta", c.beta);
    auto pyramid = make_policy("pyramidkv", options);
    auto flat = make_policy("snapkv", options);
    SequenceShape shape;
    shape.length = c.length;
    shape.n_layers = c.layers;
    shape.n_q_heads = c.n_q;
    shape.n_kv_heads = c.n_kv;
    const int budget = flat->layer_budget(0, shape).capacity;
    long total = 0;
    int previous = 1 << 30;
    for (int layer = 0; layer < c.layers; ++layer) {
      const Budget b = pyramid->layer_budget(layer, shape);
      INFO("length " << c.length << " layers " << c.layers << " ratio " << c.ratio << " layer " << layer);
      CHECK(b.capacity <= previous);
      CHECK(b.capacity >= b.recent + b.sink);
      previous = b.capacity;
      total += b.capacity;
    }
    INFO("length " << c.length << " layers " << c.layers << " ratio " << c.ratio);
    CHECK(total == static_cast<long>(budget) * c.layers);
  }
}
