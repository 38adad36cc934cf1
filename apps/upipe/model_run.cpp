#include "apps/upipe/model_run.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/errors.h"
#include "core/rng.h"
#include "model/weights.h"

namespace upipe::app {

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--model", o.model,
                 "Hugging Face model directory (config.json + safetensors), or a preset: "
                 "llama3-8b, llama3.1-8b, llama3-70b, qwen3-8b, qwen3-32b, tiny (random weights)")
      ->capture_default_str();
  cmd.add_option("--method,-m", o.method,
                 "local, ulysses, upipe, ring, usp, upipe-ring, fpdt, upipe-fpdt")
      ->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "compute dtype: fp32 or bf16")
      ->capture_default_str();
  cmd.add_option("--head-chunk,-U", o.head_chunk, "upipe: query heads per stage U (0 = C)")
      ->check(integer_in<int>(0, kMaxHeads));
  cmd.add_option("--ulysses-degree,-u", o.ulysses_degree, "usp/upipe-ring: ranks per group")
      ->check(integer_in<int>(0, 1 << 20));
  cmd.add_option("--chunks,-N", o.chunks, "fpdt: sequence chunks N (0 = default)")
      ->check(integer_in<int>(0, 1 << 30));
  cmd.add_option("--tile-tokens", o.tile_tokens, "rows per MLP / LM-head tile T")
      ->capture_default_str()
      ->check(integer_in<int64_t>(1, int64_t(1) << 30));
  cmd.add_option("--seed", o.seed, "random weights (presets) and random tokens")
      ->capture_default_str();
  cmd.add_flag("--random-weights", o.random_weights,
               "random weights for a model directory's config (a directory without weights is "
               "an error otherwise)");
  cmd.add_option("--memory-budget", o.budget, "device arena budget per rank, e.g. 80G")
      ->capture_default_str();
  cmd.add_flag("--offload-checkpoints", o.offload_checkpoints,
               "keep the layer checkpoints in the host arena, fetched back layer by layer");
  cmd.add_option("--checkpoint-dtype", o.checkpoint_dtype,
                 "layer checkpoints stored as fp32 (exact) or bf16 (half the bytes)")
      ->capture_default_str();
  cmd.add_option("--checkpoint-granularity", o.checkpoint_granularity,
                 "layer, block (the attention forward runs once less) or none (block + the MLP's "
                 "products kept)")
      ->capture_default_str();
  cmd.add_option("--residual-dtype", o.residual_dtype,
                 "residual stream and its gradient: fp32, or bf16 with --dtype bf16")
      ->capture_default_str();
}

std::vector<int32_t> random_tokens(const ModelConfig& m, int64_t n, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int32_t(uniform_at(seed + 7, i) * double(m.vocab_size)) % int32_t(m.vocab_size);
  return tokens;
}

nlohmann::json memory_stack_json(const ModelOptions& o) {
  return {{"dtype", o.dtype},
          {"residual_dtype", o.residual_dtype},
          {"checkpoint_dtype", o.checkpoint_dtype},
          {"checkpoint_granularity", o.checkpoint_granularity},
          {"tile_tokens", o.tile_tokens},
          {"offload_checkpoints", o.offload_checkpoints}};
}

namespace {

// The attention block's messages name its command-line flags (--heads, --kv-heads); a model's
// heads come from its config instead, so name the field and the file there.
std::string name_model_fields(std::string msg, const ModelConfig& m) {
  const std::pair<const char*, const char*> fields[] = {{"--kv-heads", "num_key_value_heads"},
                                                        {"--heads", "num_attention_heads"}};
  for (const auto& [flag, field] : fields)
    for (size_t at = msg.find(flag); at != std::string::npos; at = msg.find(flag, at + 1))
      msg.replace(at, std::char_traits<char>::length(flag),
                  fmt::format("{} of {}", field, m.source));
  return msg;
}

DecoderOptions decoder_options(const ModelOptions& o, int64_t seq_len) {
  DecoderOptions d;
  d.method = o.method;
  d.attn.seq_len = seq_len;
  d.attn.dtype = parse_dtype(o.dtype);
  d.attn.head_chunk = o.head_chunk;
  d.attn.ulysses_degree = o.ulysses_degree;
  d.attn.chunks = o.chunks;
  d.tile_tokens = o.tile_tokens;
  d.offload_checkpoints = o.offload_checkpoints;
  d.checkpoint_dtype = parse_dtype(o.checkpoint_dtype);
  d.residual_dtype = parse_dtype(o.residual_dtype);
  d.checkpoint_granularity = parse_checkpoint_granularity(o.checkpoint_granularity);
  return d;
}

DeviceOptions device_options(const ModelOptions& o) {
  const int64_t budget = parse_bytes(o.budget);
  return {BackendKind::kCpu, budget, budget};
}

}  // namespace

ModelRun::ModelRun(Communicator& world, const ModelConfig& m, const ModelOptions& o,
                   int64_t seq_len)
    : dev(device_options(o)) {
  const DecoderOptions dopt = decoder_options(o, seq_len);
  const std::string weights = weights_dir(o.model, o.random_weights);
  const int64_t rows = (seq_len + world.size() - 1) / world.size();
  dev.mem().check_fits(full_model_floor(m, dopt.attn.dtype, rows, dopt.residual_dtype));
  try {
    dec = std::make_unique<Decoder>(dev, world, m, dopt);
  } catch (const ConfigError& e) {
    throw ConfigError(name_model_fields(e.what(), m));
  }
  w = load_params(dev, m, weights, dopt.attn.dtype, o.seed);
  g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
}

int64_t max_over_ranks(Communicator& world, int64_t v) {
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&v, all.data(), sizeof(int64_t));
  return *std::max_element(all.begin(), all.end());
}

}  // namespace upipe::app
