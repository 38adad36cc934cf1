// What `upipe eval` and `upipe bench model` share: the model and strategy flags, the token
// sequence without a file, and one rank's decoder with its parameters and gradients on its own
// device, built in the order that finds bad input (config, strategy, weights) before any data
// moves.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/upipe/cli.h"
#include "model/decoder.h"

namespace upipe::app {

struct ModelOptions {
  std::string model = "tiny";  // a Hugging Face model directory / config.json, or a preset
  std::string method = "local";
  std::string dtype = "fp32";           // compute dtype
  std::string residual_dtype = "fp32";  // the residual stream and its gradient
  int head_chunk = 0, ulysses_degree = 0, chunks = 0;
  int64_t tile_tokens = 1024;
  uint64_t seed = 1;            // random weights (presets, --random-weights) and tokens
  bool random_weights = false;  // a directory's config with random weights instead of its own
  std::string budget = "1T";
  bool offload_checkpoints = false;
  std::string checkpoint_dtype = "fp32";
  std::string checkpoint_granularity = "layer";
};

// --model --method --dtype --head-chunk --ulysses-degree --chunks --tile-tokens --seed
// --memory-budget --offload-checkpoints (each command adds its own --seq-len).
void add_model_options(CLI::App& cmd, ModelOptions& o);

// The memory-stack options of a run, for its JSON output: dtype, residual_dtype,
// checkpoint_dtype, checkpoint_granularity, tile_tokens, offload_checkpoints.
nlohmann::json memory_stack_json(const ModelOptions& o);

// n uniform random ids in [0, V), a pure function of (seed, index): the same on every rank.
std::vector<int32_t> random_tokens(const ModelConfig& m, int64_t n, uint64_t seed);

// One rank's model: its device (budget from --memory-budget), the decoder over `world` for a
// sequence of seq_len tokens, the parameters (the checkpoint's, or random) and fp32 gradients.
// A strategy's complaint about the heads names the config field they come from.
struct ModelRun {
  ModelRun(Communicator& world, const ModelConfig& m, const ModelOptions& o, int64_t seq_len);
  Device dev;
  std::unique_ptr<Decoder> dec;
  ParamMap w;  // tag params, compute dtype
  ParamMap g;  // tag grads, fp32
};

// The largest of the ranks' values (every rank gets it).
int64_t max_over_ranks(Communicator& world, int64_t v);

}  // namespace upipe::app
