// `upipe export`'s work: a training checkpoint as a consolidated Hugging Face folder that
// transformers loads (config.json and model.safetensors, every tensor under its Hugging Face name,
// a tied embedding once), streamed piece by piece from the verified rank files, so no tensor is
// held whole in memory, and the tokenizer that goes with it (copied from the run's Hugging Face
// directory, or the byte tokenizer of `upipe tokenize`) so AutoTokenizer loads the folder too.
// The folder is the user's: a non-empty one is refused unless forced, and forced, the model files a
// loader would read (config, weights, tokenizer) are replaced only once the new ones are written.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"

namespace upipe {

// The files of a Hugging Face folder a loader reads as its model, which export --force replaces
// (config, generation config, weights, tokenizer), said in words for messages and help.
const char* hf_model_files_text();

// The tokenizer files of a Hugging Face folder, the names a loader reads. An export copies them,
// and generation_config.json beside them, from one folder.
const std::vector<std::string>& hf_tokenizer_files();

// Which tokenizer an export writes. kAuto: the tokenizer files of the run's model.init_from
// directory, else of its model.name when that is a directory, else the byte tokenizer when the
// vocabulary is exactly the byte vocabulary (256), else none.
struct TokenizerChoice {
  enum class Kind { kAuto, kNone, kBytes, kDir } kind = Kind::kAuto;
  std::string dir;  // kDir: a Hugging Face folder to copy the tokenizer files from
};

// "auto", "none", "bytes" or a directory.
TokenizerChoice parse_tokenizer_choice(const std::string& s);

// What the choice resolves to for this checkpoint: the files to copy (from `dir`) or the byte
// tokenizer, and a line saying which and why. ConfigError when an explicit choice cannot be met
// (a directory without tokenizer files, bytes for a vocabulary below 256).
struct TokenizerPlan {
  bool bytes = false;
  std::string dir;                 // copy these files from here
  std::vector<std::string> files;  // names in hf_tokenizer_files() that dir holds
  std::string note;                // "tokenizer: copied from DIR (tokenizer.json, ...)"
};
TokenizerPlan plan_tokenizer(const CheckpointReader& reader, const TokenizerChoice& choice);

// Writes the checkpoint as `out`/config.json and `out`/model.safetensors in `dtype`, and the
// tokenizer `tok` says. ConfigError, with nothing changed, when `out` is not a directory, is the
// checkpoint, holds it, or is one of the run's own Hugging Face directories, or is not empty and
// not `force`. Every file is first written (and every piece of the checkpoint verified) in a
// staging directory inside `out`; only then is each moved over its namesake (one rename each),
// and, with force, the other model files hf_model_files_text names removed (other files stay). A
// failure before that leaves `out` as it was (a directory export created is removed); an
// interrupted export's staging directory is removed by the next export into `out`.
// Weights larger than `max_shard_bytes` (0: no bound) are written as shards
// model-0000K-of-0000N.safetensors with model.safetensors.index.json, cut as transformers'
// save_pretrained cuts them (shard_tensors). Returns the number of weight files.
int export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force,
               const TokenizerPlan& tok, int64_t max_shard_bytes = 0);

// The shards of `items` (indices, in order): a new shard where the next tensor would take the
// current one past `max_shard_bytes`, a tensor larger than that alone; one shard when <= 0.
std::vector<std::vector<size_t>> shard_tensors(const std::vector<SafetensorsWriteItem>& items,
                                               int64_t max_shard_bytes);
int64_t tensor_bytes(const SafetensorsWriteItem& t);

}  // namespace upipe
