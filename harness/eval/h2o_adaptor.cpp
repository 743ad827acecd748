#include "harness/eval/h2o_adaptor.h"

#include <algorithm>

#include "harness/common/enum_names.h"
#include "harness/common/errors.h"
#include "tasks/ftfy.h"

namespace kvevict {

H2OScoredRequest score_h2o_request(const Model& model, const Policy& policy, Mode mode,
                                   const LoglikelihoodRequest& request) {
  const Tokenizer& tokenizer = model.require_tokenizer();
  const std::string context = ftfy_fix_text_nfkc(request.context);
  const std::string continuation = ftfy_fix_text_nfkc(request.continuation);
  const std::vector<int> joint = tokenizer.encode(context + continuation);
  const int n_ctx = static_cast<int>(tokenizer.encode(context).size());
  const int n_cont = static_cast<int>(tokenizer.encode(continuation).size());
  const int L = static_cast<int>(joint.size());
  if (L < 2) throw Error("request \"" + request.context + request.continuation + "\" encodes to fewer than 2 tokens");

  const int n_all = std::min(n_ctx + n_cont, kH2OWindow);
  const int first_scored = std::max(0, n_all - n_cont - 1);
  SequenceScore score = score_sequence(model, policy, mode, joint, /*prefill_len=*/0, /*budget_length=*/L,
                                       /*final_target=*/-1, /*first_logprob=*/first_scored);
  H2OScoredRequest out;
  out.kv = score.kv;
  out.joint_length = L;
  out.result.is_greedy = true;
  for (int i = first_scored; i < n_all - 1 && i < kH2OWindow; ++i) {
    if (i + 1 >= L) break;
    out.result.sum_logprob += score.next_token_logprob[i];
    out.result.num_tokens += 1;
    if (score.argmax[i] != joint[i + 1]) out.result.is_greedy = false;
  }
  if (out.result.num_tokens == 0)
    throw Error("request \"" + request.continuation + "\": the H2O eval mask selects no position of the joint sequence");
  return out;
}

}  // namespace kvevict
