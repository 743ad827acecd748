// RULER's variable tracking, "vt" (scripts/data/synthetic/variable_tracking.py with
// num_chains 1, num_hops 4, noise haystack).
//
// One chain "VAR AAAAA = 12345", "VAR BBBBB = VAR AAAAA ", ... (five names of five
// capitals, a 5-digit value, the hop lines' trailing space as RULER writes them) is
// spread over noise paragraphs joined by "\n". The prompt opens with a one-shot example:
// the same task with 3-letter names and its answer, fitted to 500 tokens as RULER fits it
// (at least five paragraphs, one position per chain line). Then
// "Memorize and track the chain(s) of variable assignment hidden in the following
// text.\n\n{context}\nQuestion: Find all variables that are assigned the value {value} in
// the text above." and the answer prefix " Answer: According to the chain(s) of variable
// assignment in the text above, 5 variables are assigned the value {value}, they are: ".
// Units: noise paragraphs. References: the five names.
#include <algorithm>
#include <memory>

#include "harness/tokenizers/tokenizer.h"
#include "tasks/long_context.h"

namespace kvevict {
namespace {

using namespace long_context;

const char* const kUppercase = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
constexpr int kHops = 4;
constexpr int kExampleTokens = 500;  // RULER fits its example to max_seq_length=500

struct Chain {
  std::vector<std::string> names;
  std::string value;
  std::vector<std::string> lines;
};

Chain draw_chain(PythonRandom& rng, int name_length) {
  Chain chain;
  while (chain.names.size() < kHops + 1) {
    std::string name = random_letters(rng, kUppercase, name_length);
    if (std::find(chain.names.begin(), chain.names.end(), name) == chain.names.end()) chain.names.push_back(name);
  }
  chain.value = std::to_string(randint(rng, 10000, 99998));  // np.random.randint(10000, 99999)
  chain.lines.push_back("VAR " + chain.names[0] + " = " + chain.value);
  for (int j = 0; j < kHops; ++j) chain.lines.push_back("VAR " + chain.names[j + 1] + " = VAR " + chain.names[j] + " ");
  return chain;
}

// One task text: its context (up to the question) and its question with the answer prefix.
struct VtText {
  std::string context, question;
  std::vector<Needle> needles;  // offsets within `context`
};

VtText write_vt(const Chain& chain, PythonRandom& position_rng, int units) {
  std::vector<std::string> lines(static_cast<size_t>(units), kNoiseParagraph);
  std::vector<size_t> positions = position_rng.sample(static_cast<size_t>(units), chain.lines.size());
  std::sort(positions.begin(), positions.end());
  std::vector<Needle> needles(chain.lines.size());
  for (size_t j = 0; j < chain.lines.size(); ++j) {
    lines.insert(lines.begin() + static_cast<long>(positions[j] + j), chain.lines[j]);
    needles[j].text = chain.lines[j];
    needles[j].units_before = static_cast<int>(positions[j]);
    needles[j].depth = static_cast<double>(positions[j]) / units;
  }
  VtText text;
  text.context = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  size_t next_needle = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) text.context += "\n";
    if (next_needle < needles.size() && i == positions[next_needle] + next_needle)
      needles[next_needle++].offset = text.context.size();
    text.context += lines[i];
  }
  text.context += "\n";
  text.question = "Question: Find all variables that are assigned the value " + chain.value +
                  " in the text above. Answer: According to the chain(s) of variable assignment in the text above, " +
                  std::to_string(kHops + 1) + " variables are assigned the value " + chain.value + ", they are: ";
  text.needles = std::move(needles);
  return text;
}

class RulerVt : public LongContextRecipe {
 public:
  explicit RulerVt(const LongContextSetup& setup) {
    // RULER fits one example to 500 tokens (falling back to its lower bound of 5 units);
    // every item then redraws the example's names and value (randomize_icl).
    const uint64_t example_seed = item_seed(setup.options.seed, setup.task + "/example", 0, 0);
    auto fits = [&](int units) {
      const std::string text = example_prompt(example_seed, units);
      return static_cast<int>(setup.tokenizer.encode(text).size()) <= kExampleTokens;
    };
    int lo = min_units(), hi = lo;
    if (fits(lo)) {
      for (hi = 2 * lo; fits(hi); hi *= 2) lo = hi;
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
    }
    example_units_ = lo;
  }

  int tokens_to_generate() const override { return 30; }
  int min_units() const override { return kHops + 1; }

  LongContextItem build(uint64_t seed, int units) const override {
    PythonRandom example_rng = stream(seed, "example");
    const Chain example = draw_chain(example_rng, 3);
    const VtText example_text = write_vt(example, example_rng, example_units_);
    PythonRandom chain_rng = stream(seed, "chain");
    PythonRandom position_rng = stream(seed, "positions");
    const Chain chain = draw_chain(chain_rng, 5);
    VtText text = write_vt(chain, position_rng, units);

    LongContextItem item;
    // RULER appends " " + the answer to the example's prompt (after the prefix's own
    // trailing space), then "\n", then "\n" before the task.
    item.context = example_text.context + example_text.question + " ";
    for (size_t i = 0; i < example.names.size(); ++i) item.context += (i ? " " : "") + example.names[i];
    item.context += "\n\n";
    for (Needle& needle : text.needles) needle.offset += item.context.size();
    item.context += text.context;
    item.question = text.question;
    item.references = chain.names;
    item.needles = std::move(text.needles);
    item.haystack = "noise";
    return item;
  }

 private:
  static std::string example_prompt(uint64_t seed, int units) {
    PythonRandom rng = stream(seed, "example");
    const Chain example = draw_chain(rng, 3);
    const VtText text = write_vt(example, rng, units);
    return text.context + text.question;
  }

  int example_units_ = kHops + 1;
};

}  // namespace

std::unique_ptr<Task> make_ruler_vt_task() {
  return make_long_context_task(
      "ruler_vt", [](const LongContextSetup& setup) { return std::make_unique<RulerVt>(setup); },
      LongContextScoring::RulerStringMatch);
}

}  // namespace kvevict
