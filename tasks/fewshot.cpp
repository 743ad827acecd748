#include "tasks/fewshot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <unordered_set>

#include "harness/common/errors.h"
#include "tasks/jsonl.h"

namespace kvevict {

namespace {
constexpr size_t kN = 624, kM = 397;
}

PythonRandom::PythonRandom(long long seed)
    : PythonRandom(Magnitude{seed < 0 ? 0ULL - static_cast<unsigned long long>(seed)
                                      : static_cast<unsigned long long>(seed)}) {}

PythonRandom PythonRandom::from_seed(uint64_t seed) { return PythonRandom(Magnitude{seed}); }

PythonRandom::PythonRandom(Magnitude seed_magnitude) {
  // random.seed(int): the key is abs(seed) as little-endian 32-bit words ([0] for 0).
  unsigned long long magnitude = seed_magnitude.value;
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(magnitude & 0xffffffffULL));
    magnitude >>= 32;
  } while (magnitude != 0);

  // init_genrand(19650218) then init_by_array(key), as in CPython's _randommodule.c.
  state_[0] = 19650218U;
  for (size_t i = 1; i < kN; ++i)
    state_[i] = 1812433253U * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  size_t i = 1, j = 0;
  for (size_t k = std::max(kN, key.size()); k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525U)) + key[j] +
                static_cast<uint32_t>(j);
    ++i, ++j;
    if (i >= kN) state_[0] = state_[kN - 1], i = 1;
    if (j >= key.size()) j = 0;
  }
  for (size_t k = kN - 1; k > 0; --k) {
    state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941U)) -
                static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) state_[0] = state_[kN - 1], i = 1;
  }
  state_[0] = 0x80000000U;
  index_ = kN;
}

uint32_t PythonRandom::next_uint32() {
  if (index_ >= kN) {
    auto twist = [](uint32_t upper, uint32_t lower, uint32_t far) {
      const uint32_t y = (upper & 0x80000000U) | (lower & 0x7fffffffU);
      return far ^ (y >> 1) ^ ((y & 1U) ? 0x9908b0dfU : 0U);
    };
    for (size_t k = 0; k < kN; ++k)
      state_[k] = twist(state_[k], state_[(k + 1) % kN], state_[(k + kM) % kN]);
    index_ = 0;
  }
  uint32_t y = state_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

uint64_t PythonRandom::getrandbits(int k) {
  if (k < 1 || k > 64) throw Error("getrandbits: k must be in [1, 64]");
  if (k <= 32) return next_uint32() >> (32 - k);
  // Words fill from the least significant end; the last word keeps its top bits.
  const uint64_t low = next_uint32();
  const uint64_t high = next_uint32() >> (64 - k);
  return low | (high << 32);
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  if (n == 0) return 0;
  int k = 0;
  for (uint64_t v = n; v != 0; v >>= 1) ++k;  // n.bit_length()
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

double PythonRandom::random() {
  const uint32_t a = next_uint32() >> 5, b = next_uint32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

std::vector<size_t> PythonRandom::sample(size_t n, size_t k) {
  if (k > n)
    throw Error("sample larger than population (" + std::to_string(k) + " > " + std::to_string(n) +
                ")");
  std::vector<size_t> result(k);
  // Python picks by memory footprint: a pool copy when the population is no larger
  // than the set it would otherwise build.
  size_t setsize = 21;
  if (k > 5)
    setsize += static_cast<size_t>(std::pow(4.0, std::ceil(std::log(3.0 * k) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = randbelow(n - i);
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::unordered_set<size_t> selected;
    for (size_t i = 0; i < k; ++i) {
      size_t j = randbelow(n);
      while (selected.count(j)) j = randbelow(n);
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

std::string fewshot_context(const std::vector<std::string>& labeled_examples,
                            const std::string& query) {
  std::string context;
  for (const auto& example : labeled_examples) context += example + "\n\n";
  return context + query;
}

FewshotSchedule lm_eval_schedule(const std::vector<std::string>& eval_identities,
                                 std::optional<size_t> num_training, const TaskOptions& options,
                                 const std::string& what) {
  if (options.shots < 0) throw Error(what + ": shots must be >= 0");
  const size_t n = eval_identities.size();
  const auto shots = static_cast<size_t>(options.shots);
  FewshotSchedule schedule;
  PythonRandom rnd = PythonRandom::from_seed(options.seed);
  schedule.doc_order.resize(n);
  for (size_t i = 0; i < n; ++i) schedule.doc_order[i] = i;
  if (options.lm_eval_shuffle) rnd.shuffle(schedule.doc_order);
  if (options.limit >= 0 && static_cast<size_t>(options.limit) < n)
    schedule.doc_order.resize(static_cast<size_t>(options.limit));

  if (shots > 0 && num_training && shots > *num_training)
    throw Error(what + ": " + std::to_string(shots) +
                " shots requested but the training split has only " +
                std::to_string(*num_training) + " examples");
  if (shots > 0 && !num_training && shots + 1 > n)
    throw Error(what + ": " + std::to_string(shots) + " shots need at least " +
                std::to_string(shots + 1) + " evaluation documents, found " + std::to_string(n));

  for (size_t doc : schedule.doc_order) {
    std::vector<size_t> examples;
    if (shots > 0 && num_training) {
      examples = rnd.sample(*num_training, shots);
    } else if (shots > 0) {
      for (size_t candidate : rnd.sample(n, shots + 1))
        if (eval_identities[candidate] != eval_identities[doc] && examples.size() < shots)
          examples.push_back(candidate);
    }
    schedule.examples.push_back(std::move(examples));
  }
  return schedule;
}

std::string training_split(const std::string& data_dir, const std::vector<std::string>& candidates) {
  std::string tried;
  for (const auto& relative : candidates) {
    const std::string path = data_file(data_dir, relative);
    if (std::filesystem::exists(path)) return path;
    tried += (tried.empty() ? "" : ", ") + path;
  }
  throw Error("missing data file: none of " + tried);
}

std::string append_partial_context(const std::string& context, const std::string& partial) {
  // Python's split scans left to right without overlaps; find where its last piece starts.
  const std::string separator = "\n\n";
  size_t last = std::string::npos;
  for (size_t pos = context.find(separator); pos != std::string::npos;
       pos = context.find(separator, pos + separator.size()))
    last = pos;
  if (last == std::string::npos) return partial;
  return context.substr(0, last) + separator + partial;
}

std::vector<MultipleChoiceDoc> lm_eval_requests(const std::vector<LmEvalDoc>& eval_docs,
                                                const std::vector<LmEvalDoc>* training,
                                                const TaskOptions& options,
                                                const std::string& what) {
  std::vector<std::string> identities;
  for (const auto& doc : eval_docs) identities.push_back(doc.identity);
  const FewshotSchedule schedule = lm_eval_schedule(
      identities, training ? std::optional<size_t>(training->size()) : std::nullopt, options, what);
  const auto& pool = training ? *training : eval_docs;

  std::vector<MultipleChoiceDoc> out;
  for (size_t s = 0; s < schedule.doc_order.size(); ++s) {
    const LmEvalDoc& doc = eval_docs[schedule.doc_order[s]];
    std::vector<std::string> labeled;
    for (size_t e : schedule.examples[s]) labeled.push_back(pool[e].text + pool[e].target);
    const std::string context = fewshot_context(labeled, doc.text);

    MultipleChoiceDoc mc;
    mc.id = doc.id;
    mc.gold = doc.gold;
    mc.choice_texts = doc.choice_texts;
    for (size_t c = 0; c < doc.continuations.size(); ++c) {
      const std::string ctx = doc.partial_contexts.empty()
                                  ? context
                                  : append_partial_context(context, doc.partial_contexts[c]);
      mc.requests.push_back({ctx, doc.continuations[c]});
    }
    out.push_back(std::move(mc));
  }
  return out;
}

}  // namespace kvevict
