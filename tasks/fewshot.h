// Few-shot sampling and prompt joining exactly as lm-evaluation-harness 0.3.0 does it.
//
// lm-eval 0.3's evaluator makes ONE random.Random(42) per task, shuffles the evaluation
// documents with it, keeps the first `limit`, and then, document by document in that
// order, draws few-shot examples from the same generator. PythonRandom reproduces
// CPython's generator bit for bit so the drawn examples are the ones lm-eval would draw.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace kvevict {

// CPython's random.Random: MT19937 seeded from an int by init_by_array.
class PythonRandom {
 public:
  explicit PythonRandom(long long seed);  // random.Random(seed)
  // random.Random(seed) for a seed read as unsigned 64 bits (every seed kvevict reads):
  // one above 2^63 - 1 must not be taken for a negative number.
  static PythonRandom from_seed(uint64_t seed);
  uint32_t next_uint32();                 // genrand_uint32
  uint64_t getrandbits(int k);            // 1 <= k <= 64
  uint64_t randbelow(uint64_t n);         // _randbelow_with_getrandbits
  double random();                        // random.random()
  // random.sample(range(n), k): the chosen indices in the order Python returns them.
  std::vector<size_t> sample(size_t n, size_t k);
  // random.shuffle(x).
  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) std::swap(x[i], x[randbelow(i + 1)]);
  }

 private:
  struct Magnitude {
    unsigned long long value;
  };
  explicit PythonRandom(Magnitude seed_magnitude);  // random.seed(int): keyed by abs(seed)
  std::array<uint32_t, 624> state_{};
  size_t index_ = 624;
};

// lm-eval fewshot_context: each example is doc_to_text + doc_to_target; examples are
// joined by "\n\n" and followed by "\n\n" before the query (nothing when there are none).
std::string fewshot_context(const std::vector<std::string>& labeled_examples,
                            const std::string& query);

// One document in lm-eval's terms.
struct LmEvalDoc {
  std::string id;
  std::string text;    // doc_to_text
  std::string target;  // doc_to_target: the gold continuation, used when it is a few-shot example
  std::vector<std::string> continuations;  // one loglikelihood request per choice
  // Partial evaluation (Winogrande): per choice, the text that replaces this document's
  // own text at the end of the context (lm-eval's append_context). Empty otherwise.
  std::vector<std::string> partial_contexts;
  std::vector<std::string> choice_texts;  // acc_norm's character-length normaliser
  int gold = 0;
  // Equality key for lm-eval's `x != doc` when few-shot examples come from the
  // evaluation split itself (all of the doc's fields).
  std::string identity;
};

// Which evaluation documents are scored, in which order, and with which examples.
struct FewshotSchedule {
  std::vector<size_t> doc_order;              // indices into the evaluation docs
  std::vector<std::vector<size_t>> examples;  // per entry of doc_order: example indices
};

// lm-eval 0.3 evaluator + fewshot_context. With a training split (num_training set)
// each document gets rnd.sample(training, shots); without one it gets
// rnd.sample(eval_docs, shots + 1) minus documents equal to itself, cut to `shots`.
// `eval_identities` are the evaluation docs' identity keys. `what` names the task in errors.
FewshotSchedule lm_eval_schedule(const std::vector<std::string>& eval_identities,
                                 std::optional<size_t> num_training, const TaskOptions& options,
                                 const std::string& what);

// Builds the requests for every scheduled document. Few-shot examples come from
// `*training`, or from `eval_docs` when the task has no training split (nullptr).
std::vector<MultipleChoiceDoc> lm_eval_requests(const std::vector<LmEvalDoc>& eval_docs,
                                                const std::vector<LmEvalDoc>* training,
                                                const TaskOptions& options,
                                                const std::string& what);

// The training split few-shot examples come from: the first of `candidates` (relative to
// the data folder) that exists, so the full split is used where it is shipped and a small
// one only where it is not. Throws naming the candidates when none exists.
std::string training_split(const std::string& data_dir, const std::vector<std::string>& candidates);

// Winogrande's append_context: split the context on "\n\n" the way Python's str.split
// does, drop the last piece (the document's own text) and put `partial` in its place.
std::string append_partial_context(const std::string& context, const std::string& partial);

}  // namespace kvevict
