#include "harness/config/eval_config.h"

#include "harness/common/enum_names.h"
#include "harness/common/errors.h"
#include "harness/common/version.h"

namespace kvevict {

const EnumName<Mode> kModeNames[] = {{Mode::Sim, "sim"}, {Mode::Decode, "decode"}};
Mode parse_mode(const std::string& name) { return parse_enum(kModeNames, "mode", name); }
std::string mode_name(Mode mode) { return enum_name(kModeNames, mode); }

const EnumName<Protocol> kProtocolNames[] = {{Protocol::Stream, "stream"},
                                             {Protocol::PrefillCompress, "prefill-compress"}};
Protocol parse_protocol(const std::string& name) { return parse_enum(kProtocolNames, "protocol", name); }
std::string protocol_name(Protocol p) { return enum_name(kProtocolNames, p); }

const EnumName<QuestionMode> kQuestionModeNames[] = {{QuestionMode::Aware, "aware"},
                                                     {QuestionMode::Agnostic, "agnostic"}};
QuestionMode parse_question_mode(const std::string& name) { return parse_enum(kQuestionModeNames, "question", name); }
std::string question_mode_name(QuestionMode m) { return enum_name(kQuestionModeNames, m); }

const EnumName<ScoreMode> kScoreModeNames[] = {{ScoreMode::Sum, "sum"}, {ScoreMode::Mean, "mean"}};
ScoreMode parse_score_mode(const std::string& name) { return parse_enum(kScoreModeNames, "score", name); }
std::string score_mode_name(ScoreMode m) { return enum_name(kScoreModeNames, m); }

const EnumName<SharedContext> kSharedContextNames[] = {{SharedContext::MultiTurn, "multi-turn"},
                                                       {SharedContext::MultiRequest, "multi-request"}};
SharedContext parse_shared_context(const std::string& name) {
  return parse_enum(kSharedContextNames, "shared-context", name);
}
std::string shared_context_name(SharedContext p) {
  return p == SharedContext::None ? "" : enum_name(kSharedContextNames, p);
}

const EnumName<Pipeline> kPipelineNames[] = {{Pipeline::LmEval, "lm-eval"}, {Pipeline::H2O, "h2o"}};
Pipeline parse_pipeline(const std::string& name) { return parse_enum(kPipelineNames, "pipeline", name); }
std::string pipeline_name(Pipeline pipeline) { return enum_name(kPipelineNames, pipeline); }

ResultRow identity_row(const std::string& model, const EvalConfig& c) {
  ResultRow row;
  row.model = model;
  row.task = c.task;
  row.policy = c.policy;
  const BudgetSpec& b = c.policy_options.budget;
  const auto policy = make_policy(c.policy, c.policy_options);
  if (!policy->keeps_everything()) {
    if (b.ratio > 0) row.budget = b.ratio;
    if (b.tokens > 0) row.budget_tokens = b.tokens;
    if (b.heavy_share >= 0) row.heavy_share = b.heavy_share;
    if (b.ratio > 0) {
      double share = b.heavy_share >= 0 ? b.heavy_share : policy->default_heavy_share();
      if (!policy->splits_budget()) share = 0;
      row.heavy_ratio = b.ratio * share;
      row.recent_ratio = b.ratio * (1 - share);
    }
  }
  const KvQuantSpec& quant = c.policy_options.kv_quant;
  row.kv_bits = quant.bits;
  if (quant.enabled()) {
    row.kv_group = quant.group;
    row.kv_residual = quant.residual;
  }
  if (quant.memory > 0) row.kv_memory = quant.memory;
  row.protocol = protocol_name(c.protocol);
  row.mode = mode_name(c.mode);
  row.score = score_mode_name(c.score);
  row.pipeline = pipeline_name(c.task_options.pipeline);
  row.shots = c.task_options.shots;
  row.seed = c.task_options.seed;
  if (c.task_options.limit >= 0) row.limit = c.task_options.limit;
  if (make_task(c.task)->long_context()) {
    row.length = c.task_options.length;
    if (c.task_options.depth) row.depth = *c.task_options.depth;
    row.question = question_mode_name(c.question);
    if (c.task_options.turns > 0) {
      row.turns = c.task_options.turns;
      row.shared_context = shared_context_name(c.shared_context);
    }
  }
  row.version = kvevict_version();
  return row;
}

void check_max_length_holds_length(int max_length, int length, const std::string& max_length_key,
                                   const std::string& length_key) {
  if (max_length < length)
    throw Error(max_length_key + " " + std::to_string(max_length) + " is below " + length_key + " " +
                std::to_string(length) + ": a long-context prompt is fitted to its length and never cut");
}

}  // namespace kvevict
