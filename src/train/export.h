// `upipe export`'s work: a training checkpoint as a consolidated Hugging Face folder that
// transformers loads (config.json and model.safetensors, every tensor under its Hugging Face name,
// a tied embedding once), streamed piece by piece from the verified rank files, so no tensor is
// held whole in memory, and the tokenizer that goes with it (copied from the run's Hugging Face
// directory, or the byte tokenizer of `upipe tokenize`) so AutoTokenizer loads the folder too.
// The folder is the user's: a non-empty one is refused unless forced, and forced, every weight
// file a loader could read instead of the new ones is removed first.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "train/checkpoint.h"

namespace upipe {

// The entries of `out` that a loader of a Hugging Face folder could prefer to, or mix with, a new
// model.safetensors and config.json: *.safetensors, *.safetensors.index.json, pytorch_model*.bin
// and its index, tf_model.h5, flax_model.msgpack, config.json. Sorted names.
std::vector<std::string> hf_weight_files(const std::string& out);

// The tokenizer files of a Hugging Face folder, the names a loader reads.
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
// tokenizer `tok` says. ConfigError when `out` exists and is not an empty directory, unless
// `force`; with force, the entries hf_weight_files lists are removed before writing (other files
// stay, except tokenizer files the export writes, which replace those of the same name).
void export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force,
               const TokenizerPlan& tok);

}  // namespace upipe
