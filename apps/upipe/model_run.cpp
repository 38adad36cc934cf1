#include "apps/upipe/model_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/rng.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/run_options.h"

namespace upipe::app {

std::vector<int32_t> random_tokens(const ModelConfig& m, int64_t n, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int32_t(uniform_at(seed + 7, i) * double(m.vocab_size)) % int32_t(m.vocab_size);
  return tokens;
}

nlohmann::json memory_policy_json(const MemoryPolicy& p) {
  return {{"dtype", dtype_name(p.dtype)},
          {"residual_dtype", dtype_name(p.residual_dtype)},
          {"stash_dtype", dtype_name(p.stash_dtype)},
          {"recompute", recompute_name(p.recompute)},
          {"tile_tokens", p.tile_tokens},
          {"offload_stash", p.offload_stash}};
}

ModelRun::ModelRun(Communicator& world, const ModelConfig& m, const RunConfig& c, int64_t seq_len,
                   bool grads)
    : dev(device_options(c)), comm(dev, world) {
  const DecoderOptions dopt = decoder_options(c, seq_len);
  const std::string weights = weights_dir(c.model.name, c.model.random_weights);
  // Before anything is allocated: sizes no budget can hold are an out-of-memory error now.
  const int64_t rows = (seq_len + world.size() - 1) / world.size();
  // Every rank holds the whole model here (eval and bench model shard nothing): more ranks shrink
  // only the sequence's share.
  dev.mem().set_advice(
      "every rank holds the whole model's weights (and gradients) here, unsharded: bf16, fewer "
      "tokens, --loss-only (eval), or more ranks for the sequence's share; a training step shards "
      "them (ZeRO-3): `upipe plan` gives its memory");
  dev.mem().check_fits(full_model_floor(m, dopt.memory.dtype, rows, dopt.memory.residual_dtype));
  dec = std::make_unique<Decoder>(dev, comm, m, dopt);
  w = load_params(dev, m, weights, dopt.memory.dtype, uint64_t(c.train.seed));
  if (grads) g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
}

void refuse_training_checkpoint(const std::string& path, const char* flag) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return;
  if (std::filesystem::exists(std::filesystem::path(path) / "meta.json", ec) ||
      latest_checkpoint(path))
    throw ConfigError(fmt::format(
        "{} is a training checkpoint, not a Hugging Face model; export it first: upipe export "
        "{} OUT_DIR, then {} OUT_DIR",
        path, path, flag));
}

int64_t max_over_ranks(Communicator& world, int64_t v) {
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&v, all.data(), sizeof(int64_t));
  return *std::max_element(all.begin(), all.end());
}

}  // namespace upipe::app
