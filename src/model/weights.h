// A model's parameters on a device: read from a Hugging Face checkpoint (model.safetensors, or
// sharded with model.safetensors.index.json) or, for a preset / a directory without weights,
// initialised deterministically (N(0, 0.02) matrices, unit norms, a pure function of (seed,
// name, index), so every rank and every run sees the same model).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/decoder.h"
#include "model/hf_names.h"
#include "model/safetensors.h"

namespace upipe {

// Whether `dir` (a directory) holds safetensors weights.
bool has_checkpoint(const std::string& dir);

// Every tensor of `specs` (a model's hf_tensors) in `reader` with its shape and a readable dtype,
// and no tensor of the file left unused (a config that does not describe the weights, e.g. Qwen3
// weights under model_type llama, whose QK-norms would be dropped). Unused and allowed: RoPE's
// inv_freq buffers (older Llama checkpoints) and a tied model's lm_head.weight (transformers
// ties it to the embedding too). ConfigError naming the file and tensor otherwise.
void check_weights(const SafetensorsReader& reader, const std::vector<HfTensorSpec>& specs,
                   bool tied);

// Elements [first, first + count) of tensor `index` of hf_tensors(m) (spec s), as fp32: read from
// `reader` when it is not null (checked by the caller, check_weights; a value that is not finite
// is a ConfigError naming the tensor and element), else the deterministic initialisation of
// `seed` (the values load_params gives, whatever range is asked: ZeRO-3 ranks fill exactly their
// shard).
void param_values(const HfTensorSpec& s, int index, const SafetensorsReader* reader, uint64_t seed,
                  int64_t first, int64_t count, float* dst);

// ConfigError when the Hugging Face directory `dir` cannot start a run of model m: no directory,
// no config.json, another model (naming the first field that differs) or no weights. Cheap: a run
// checks it before it reserves memory, so a wrong directory is said before an out-of-memory.
void check_init_weights(const std::string& dir, const ModelConfig& m);

// The weights of the Hugging Face directory `dir` for a run of model m, after check_init_weights.
SafetensorsReader open_init_weights(const std::string& dir, const ModelConfig& m);

// The directory whose weights a model given as `model` (a preset, a Hugging Face directory or its
// config.json) loads: "" (random weights) for a preset or when random_weights is asked for;
// ConfigError when the directory holds no weights (a dangling model.safetensors symlink, as a
// cache with a missing blob has, counts as none).
std::string weights_dir(const std::string& model, bool random_weights);

// What a rank holding the whole model needs at least (core/arena.h check_fits): its parameters
// in `dtype`, their fp32 gradients and the residual stream of its `rows` tokens.
TagBytes full_model_floor(const ModelConfig& m, DType dtype, int64_t rows, DType residual);

// Parameters of m in `dtype` on dev (tag params): from the checkpoint in `dir` when it has one
// (check_weights), else random with `seed`.
ParamMap load_params(Device& dev, const ModelConfig& m, const std::string& dir, DType dtype,
                     uint64_t seed);

}  // namespace upipe
