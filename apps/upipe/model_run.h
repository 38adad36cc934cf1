// What `upipe eval` and `upipe bench model` share: the token sequence without a file, and one
// rank's decoder with its parameters and gradients on its own device, built in the order that
// finds bad input (config, strategy, weights) before any data moves. (train shares the refusal
// of a training checkpoint given for a model.)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/upipe/cli.h"
#include "attention/device_comm.h"
#include "model/decoder.h"
#include "train/run_config.h"

namespace upipe::app {

// The memory policy of a run, for its JSON output: dtype, residual_dtype, stash_dtype,
// recompute, tile_tokens, offload_stash.
nlohmann::json memory_policy_json(const MemoryPolicy& p);

// n uniform random ids in [0, V), a pure function of (seed, index): the same on every rank.
std::vector<int32_t> random_tokens(const ModelConfig& m, int64_t n, uint64_t seed);

// One rank's model: its device (budgets from the memory settings), the decoder over `world` for
// a sequence of seq_len tokens with the settings' method and memory policy, the parameters (the
// model directory's, or random from train.seed) and fp32 gradients.
struct ModelRun {
  // grads: allocate the gradients (false: the loss alone, Decoder::loss).
  ModelRun(Communicator& world, const ModelConfig& m, const RunConfig& c, int64_t seq_len,
           bool grads = true);
  Device dev;
  DeviceComm comm;  // the decoder's: the world, or on a GPU the routed or staged one over it
  std::unique_ptr<Decoder> dec;
  ParamMap w;  // tag params, compute dtype
  ParamMap g;  // tag grads, fp32
};

// A training checkpoint where a Hugging Face model is expected: ConfigError saying to export it.
void refuse_training_checkpoint(const std::string& path, const char* flag = "--model");

// The largest of the ranks' values (every rank gets it).
int64_t max_over_ranks(Communicator& world, int64_t v);

}  // namespace upipe::app
