// tokenizer.json (byte-level BPE), then a round trip through the result.
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvevict::fuzz::scratch_file("tokenizer.json", data, size);
  try {
    auto tokenizer = kvevict::load_bpe_tokenizer_json(path);
    auto ids = tokenizer->encode("Once upon a time, \xc3\xa9l\xc3\xa8ve 123 <|endoftext|>\n  x");
    tokenizer->decode(ids);
    if (tokenizer->vocab_size() > 0) tokenizer->decode({0, tokenizer->vocab_size() - 1});
  } catch (const kvevict::Error&) {
  }
  return 0;
}
