// Text <-> token ids. Implementations: SentencePiece (tokenizer.model) and
// byte-level BPE (tokenizer.json, or vocab.json + merges.txt).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvevict {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text without adding any special tokens (BOS is the caller's choice).
  virtual std::vector<int> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  virtual int vocab_size() const = 0;
  // The BOS id a tokenizer_config.json beside the tokenizer declares (bos_token, unless
  // add_bos_token is false): -1 when it declares none (Qwen), nullopt without such a file.
  virtual std::optional<int> declared_bos() const { return std::nullopt; }
};

// SentencePiece model file (tokenizer.model).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_file);

// Byte-level BPE from a Hugging Face tokenizer.json (GPT-NeoX, Pythia, ...).
std::unique_ptr<Tokenizer> load_bpe_tokenizer_json(const std::string& tokenizer_json);

// Byte-level BPE from GPT-2 style vocab.json + merges.txt (GPT-2, OPT).
std::unique_ptr<Tokenizer> load_bpe_vocab_merges(const std::string& vocab_json,
                                                 const std::string& merges_txt);

// Picks whatever tokenizer files a model directory holds; returns nullptr when none.
std::unique_ptr<Tokenizer> load_tokenizer_for_model(const std::string& model_dir);

}  // namespace kvevict
