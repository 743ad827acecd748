// score_sequence's first_logprob: a caller that reads only a continuation skips the
// context's log-softmax, and every row it does compute has the bits of a full scoring.
#include <cmath>
#include <cstring>
#include <vector>

#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

TEST_CASE("log-probs from a later row have the bits of the full scoring", "[scorer]") {
  // 399 tokens, so the log-softmax runs in two blocks of rows.
  std::vector<int> tokens = test::golden_tokens();
  const std::vector<int> again = tokens;
  tokens.insert(tokens.end(), again.begin() + 1, again.end());
  const int T = static_cast<int>(tokens.size());
  PolicyOptions h2o_budget;
  h2o_budget.budget.ratio = 0.5;
  for (const char* name : {"full", "h2o"}) {
    auto policy = make_policy(name, std::string(name) == "full" ? PolicyOptions{} : h2o_budget);
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      const SequenceScore all = score_sequence(test::stories(), *policy, mode, tokens);
      // 257: the second 256-row block of the full scoring starts at row 256, this one at 257.
      REQUIRE(T == 399);
      for (int first : {1, 150, 257, T - 2}) {
        INFO(name << " mode " << static_cast<int>(mode) << " first " << first);
        const SequenceScore part = score_sequence(test::stories(), *policy, mode, tokens, 0, 0, 7, first);
        REQUIRE(part.next_token_logprob.size() == all.next_token_logprob.size() + 1);  // + final target
        for (int i = 0; i < first; ++i) CHECK(std::isnan(part.next_token_logprob[i]));
        bool same = true;
        for (int i = first; i < T - 1; ++i)
          same = same && std::memcmp(&part.next_token_logprob[i], &all.next_token_logprob[i], sizeof(double)) == 0;
        CHECK(same);
        CHECK(part.argmax == all.argmax);
      }
    }
  }
}
