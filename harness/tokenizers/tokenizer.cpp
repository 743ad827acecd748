// Which tokenizer a Hugging Face model directory holds.
#include <filesystem>

#include "harness/tokenizers/tokenizer.h"

namespace kvevict {

std::unique_ptr<Tokenizer> load_tokenizer_for_model(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path dir(model_dir);
  if (fs::exists(dir / "tokenizer.model"))
    return load_sentencepiece_tokenizer((dir / "tokenizer.model").string());
  if (fs::exists(dir / "tokenizer.json"))
    return load_bpe_tokenizer_json((dir / "tokenizer.json").string());
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    return load_bpe_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
  return nullptr;
}

}  // namespace kvevict
