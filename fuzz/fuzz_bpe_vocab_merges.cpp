// GPT-2 style vocab.json + merges.txt: the input is the two files separated by a NUL byte.
#include <algorithm>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* split = std::find(data, data + size, uint8_t{0});
  const std::string vocab = kvevict::fuzz::scratch_file("vocab.json", data, split - data);
  const uint8_t* merges_begin = split == data + size ? split : split + 1;
  const std::string merges = kvevict::fuzz::scratch_file("merges.txt", merges_begin, data + size - merges_begin);
  try {
    auto tokenizer = kvevict::load_bpe_vocab_merges(vocab, merges);
    auto ids = tokenizer->encode("Once upon a time, \xc3\xa9l\xc3\xa8ve 123\n  x");
    tokenizer->decode(ids);
  } catch (const kvevict::Error&) {
  }
  return 0;
}
