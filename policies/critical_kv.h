// CriticalKV and CriticalAdaKV (Feng et al. 2025, "Identify Critical KV Cache in LLM
// Inference from an Output Perturbation Perspective", arXiv 2502.03805; kvpress's
// CriticalKVPress and CriticalAdaKVPress), written "critical+POLICY" and
// "critical+ada+POLICY" over a scored policy whose heads decide on their own.
//
// The paper bounds the change of the attention output when token i is evicted by its
// attention weight times the norm of its projected value, A_i * ||v_i W_o||_1 (its output
// perturbation bound), and selects in two stages, which kvpress states as:
//   stage 1: the top int(r * b) slots by the inner policy's score s_i stay
//            (r = first_stage_ratio, b = the head's budget);
//   stage 2: the rest of b goes to the highest (s_i + eps) * ||v_i||_1, eps = 1e-4.
// Here b is the head's capacity at that compression, and its sink and recent windows
// (which stay whatever they score, as kvpress's SnapKV window scores the maximum) count
// first against the stage-1 share: stage 1 takes max(0, int(r * b) - windows) of the
// slots between them. Deviation: the value's L1 norm ||v_i||_1 stands for ||v_i W_o||_1
// (kvpress: averaged over the KV head's query heads); W_o is a model weight and policies/
// holds no model, so this is the paper's bound with W_o = I. The bound assumes scores that
// are not negative (attention-based: snapkv, h2o, pyramidkv, ...); a negative score times
// a larger norm ranks lower, as in kvpress.
//
// CriticalAdaKV: Ada-KV's allocation (policies/ada_kv.h) over the inner scores decides how
// many slots each head of the layer keeps (the layer keeps H x capacity, each head at
// least its int(ada_safeguard x capacity) best); each head then fills its count by the two
// stages above, b being that count.
#pragma once
#include <memory>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kCriticalFirstStage =
    ParamSpec::real("first_stage_ratio", 0.5,
                    "critical+POLICY: share of a head's budget chosen by the inner score alone (CriticalKV stage 1)")
        .at_least(0)
        .at_most(1);

// kvpress's epsilon: a slot the inner policy scores 0 still ranks by its value's norm.
inline constexpr double kCriticalEpsilon = 1e-4;

inline constexpr const char* kCriticalPrefix = "critical+";
inline constexpr const char* kCriticalAdaPrefix = "critical+ada+";

// Wraps `scored` (a ScoredPolicy that evicts, each head on its own); kvevict::Error
// naming the policy otherwise.
std::unique_ptr<Policy> make_critical_kv(std::unique_ptr<Policy> scored, const PolicyOptions& options);
std::unique_ptr<Policy> make_critical_ada_kv(std::unique_ptr<Policy> scored, const PolicyOptions& options);

// The two stages over one head's slots: scores that select_kept_slots (slot_selection.h)
// turns into CriticalKV's kept set under `budget` (its capacity the head's b): +inf for
// the stage-1 slots, (base + eps) * value_norm for the others. NaN base scores rank below
// every number in stage 1.
void critical_scores(const std::vector<int>& positions, const float* base, const std::vector<float>& value_norms,
                     const Budget& budget, double first_stage_ratio, std::vector<float>* out);

}  // namespace kvevict
