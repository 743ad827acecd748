#include "harness/model/model_check.h"

#include <filesystem>
#include <set>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"

namespace kvevict {

void check_tensors_match_config(const ArchSpec& arch, const WeightStore& weights, const std::string& dir) {
  std::set<std::string> expected;
  for (const TensorSpec& spec : arch.tensors) {
    expected.insert(spec.name);
    if (!weights.has(spec.name))
      throw Error(dir + ": tensor " + spec.name + " is missing (config.json " + arch.model_type + " needs it)");
    const TensorInfo& info = weights.info(spec.name);
    if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
      throw Error(info.file + ": tensor " + spec.name + " has dtype " + info.dtype + ", expected F32, F16 or BF16");
    if (info.shape != spec.shape)
      throw Error(info.file + ": tensor " + spec.name + " has shape " + shape_string(info.shape) +
                  " but config.json implies " + shape_string(spec.shape));
  }
  for (const std::string& name : weights.names()) {
    if (expected.count(name)) continue;
    bool ignored = false;
    for (const auto& suffix : arch.ignored_suffixes) ignored = ignored || ends_with(name, suffix);
    if (!ignored)
      throw Error(weights.info(name).file + ": unexpected tensor " + name + " for model_type " + arch.model_type);
  }
}

void check_tokenizer_fits(const Tokenizer* tokenizer, const ArchSpec& arch, const std::string& dir) {
  if (tokenizer && tokenizer->vocab_size() > arch.vocab)
    throw Error(dir + ": the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                " tokens but config.json vocab_size is " + std::to_string(arch.vocab));
}

ModelCheck check_model(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw Error(dir + ": not a folder (check-model takes a model folder)");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(config_path + ": no such file (not a model directory?)");
  const nlohmann::json config = read_json_file(config_path);
  checked_model_type(config, config_path);
  const WeightStore weights = WeightStore::open(dir);
  const ArchSpec arch =
      describe_architecture(config, config_path, [&](const std::string& name) { return weights.has(name); });
  check_tensors_match_config(arch, weights, dir);
  ModelCheck check;
  check.model_type = arch.model_type;
  check.files = weights.file_count();
  check.tensors = weights.names().size();
  check.bytes = weights.total_bytes();
  check.checksummed_records = weights.verify_checksums();
  const auto tokenizer = load_tokenizer_for_model(dir);
  check_tokenizer_fits(tokenizer.get(), arch, dir);
  if (tokenizer) check.tokenizer_tokens = tokenizer->vocab_size();
  return check;
}

}  // namespace kvevict
