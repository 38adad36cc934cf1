// `upipe export`'s work: a training checkpoint as a consolidated Hugging Face folder that
// transformers loads (config.json and model.safetensors, every tensor under its Hugging Face name,
// a tied embedding once), streamed piece by piece from the verified rank files, so no tensor is
// held whole in memory. The folder is the user's: a non-empty one is refused unless forced, and
// forced, every weight file a loader could read instead of the new ones is removed first.
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

// Writes the checkpoint as `out`/config.json and `out`/model.safetensors in `dtype`. ConfigError
// when `out` exists and is not an empty directory, unless `force`; with force, the entries
// hf_weight_files lists are removed before writing (other files, tokenizer ones, stay).
void export_hf(const CheckpointReader& reader, const std::string& out, DType dtype, bool force);

}  // namespace upipe
