// `upipe eval`: one forward + backward of a Llama-3 / Qwen3 model on one token sequence, split
// over the ranks of the job with any attention strategy: the loss (transformers' labels =
// input_ids mean), the gradient norms, time and per-rank memory; --save-grads writes every
// parameter's fp32 gradient (summed over the ranks) under its Hugging Face name.
#include <cmath>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "backend/tensor_ops.h"
#include "core/errors.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/safetensors.h"
#include "model/tokens.h"
#include "model/weights.h"

namespace upipe::app {
namespace {

struct Options {
  std::string model = "tiny";
  std::string tokens;
  int64_t seq_len = 0;
  std::string method = "local";
  std::string dtype = "fp32";
  int head_chunk = 0, ulysses_degree = 0, chunks = 0;
  int64_t tile_tokens = 1024;
  uint64_t seed = 1;
  std::string budget = "1T";
  std::string save_grads;
  bool offload_checkpoints = false;
  bool json = false;
};

int run(Process& proc, const Options& opt) {
  const ModelConfig m = load_model_config(opt.model);
  std::vector<int32_t> tokens;
  if (!opt.tokens.empty()) {
    tokens = read_tokens(opt.tokens, m.vocab_size);
  } else {  // no file: uniform random ids, the same on every rank
    if (opt.seq_len <= 0)
      throw ConfigError("give --tokens FILE (.npy or .bin), or --seq-len S for random tokens");
    tokens.resize(static_cast<size_t>(opt.seq_len));
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] =
          int32_t(uniform_at(opt.seed + 7, i) * double(m.vocab_size)) % int32_t(m.vocab_size);
  }
  if (opt.seq_len > int64_t(tokens.size()))
    throw ConfigError(fmt::format("--seq-len {} is longer than the {} tokens of {}", opt.seq_len,
                                  tokens.size(), opt.tokens));
  if (opt.seq_len > 0) tokens.resize(static_cast<size_t>(opt.seq_len));
  if (tokens.size() < 2) throw ConfigError("the sequence needs at least 2 tokens");
  DecoderOptions dopt;
  dopt.method = opt.method;
  dopt.attn.seq_len = int64_t(tokens.size());
  dopt.attn.dtype = parse_dtype(opt.dtype);
  dopt.attn.head_chunk = opt.head_chunk;
  dopt.attn.ulysses_degree = opt.ulysses_degree;
  dopt.attn.chunks = opt.chunks;
  dopt.tile_tokens = opt.tile_tokens;
  dopt.offload_checkpoints = opt.offload_checkpoints;
  const int64_t budget = parse_bytes(opt.budget);
  Device dev({BackendKind::kCpu, budget, budget});
  Decoder dec(dev, proc.world, m, dopt);
  const ParamMap w = load_params(dev, m, opt.model, dopt.attn.dtype, opt.seed);
  const ParamMap g = allocate_params(dev, m, DType::kF32, Tag::kGrads);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  const double loss = dec.loss_and_grads(tokens, w, g);
  const int64_t peak = dev.mem().peak(), host_peak = dev.host().peak();
  const TagBytes at_peak = dev.mem().at_peak_by_tag();
  // Full gradients: the sum of the ranks' contributions.
  nlohmann::json norms = nlohmann::json::object();
  double total = 0;
  std::vector<std::vector<float>> full;  // kept alive for items' data pointers
  std::vector<SafetensorsWriteItem> items;
  full.reserve(g.size());
  for (const auto& [name, t] : g) {
    std::vector<float> v = download(dev, t);
    proc.world.all_reduce(v.data(), int64_t(v.size()), DType::kF32, ReduceOp::kSum);
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    norms[name] = std::sqrt(ss);
    total += ss;
    if (!opt.save_grads.empty()) {
      full.push_back(std::move(v));
      items.push_back({name, DType::kF32, {t.rows(), t.cols()}, full.back().data()});
      if (t.rows() == 1) items.back().shape = {t.cols()};
    }
  }
  std::vector<int64_t> peaks(static_cast<size_t>(proc.world.size()));
  proc.world.all_gather(&peak, peaks.data(), sizeof(int64_t));
  if (!proc.root()) return 0;
  if (!opt.save_grads.empty()) write_safetensors(opt.save_grads, items, {{"format", "pt"}});
  nlohmann::json j = {{"model", m.source},
                      {"loss", loss},
                      {"tokens", tokens.size()},
                      {"method", opt.method},
                      {"ranks", proc.world.size()},
                      {"dtype", opt.dtype},
                      {"peak_bytes", *std::max_element(peaks.begin(), peaks.end())},
                      {"peak_by_tag", tags_json(at_peak)},
                      {"host_peak_bytes", host_peak},
                      {"grad_norm", std::sqrt(total)},
                      {"grad_norms", norms},
                      {"fwd_s", dec.forward_seconds()},
                      {"bwd_s", dec.backward_seconds()}};
  if (opt.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s, %zu tokens, %s on %d rank(s), %s\n", m.source.c_str(), tokens.size(),
                opt.method.c_str(), proc.world.size(), opt.dtype.c_str());
    std::printf("  loss %.8f  grad norm %.6e\n", loss, std::sqrt(total));
    std::printf("  forward %.3f s, backward %.3f s, peak %s per rank (max)\n",
                dec.forward_seconds(), dec.backward_seconds(),
                format_bytes(j["peak_bytes"].get<int64_t>()).c_str());
    if (!opt.save_grads.empty()) std::printf("  gradients written to %s\n", opt.save_grads.c_str());
  }
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--model", opt->model,
                 "Hugging Face model directory (config.json + safetensors), or a preset: "
                 "llama3-8b, llama3.1-8b, llama3-70b, qwen3-8b, qwen3-32b, tiny (random weights)")
      ->capture_default_str();
  cmd.add_option("--tokens", opt->tokens,
                 "token ids: a 1-D .npy (int32/int64/uint16/uint32) or an llm.c .bin");
  cmd.add_option("--seq-len,-S", opt->seq_len,
                 "tokens to use (default: all of --tokens; required without it)")
      ->check(integer_in<int64_t>(0, int64_t(1) << 40));
  cmd.add_option("--method,-m", opt->method,
                 "local, ulysses, upipe, ring, usp, upipe-ring, fpdt, upipe-fpdt")
      ->capture_default_str();
  cmd.add_option("--dtype", opt->dtype, "compute dtype: fp32 or bf16 (the residual is fp32)")
      ->capture_default_str();
  cmd.add_option("--head-chunk,-U", opt->head_chunk, "upipe: query heads per stage U (0 = C)")
      ->check(integer_in<int>(0, kMaxHeads));
  cmd.add_option("--ulysses-degree,-u", opt->ulysses_degree, "usp/upipe-ring: ranks per group")
      ->check(integer_in<int>(0, 1 << 20));
  cmd.add_option("--chunks,-N", opt->chunks, "fpdt: sequence chunks N (0 = default)")
      ->check(integer_in<int>(0, 1 << 30));
  cmd.add_option("--tile-tokens", opt->tile_tokens, "rows per MLP / LM-head tile T")
      ->capture_default_str()
      ->check(integer_in<int64_t>(1, int64_t(1) << 30));
  cmd.add_option("--seed", opt->seed, "random weights (presets) and random tokens")
      ->capture_default_str();
  cmd.add_option("--memory-budget", opt->budget, "device arena budget per rank, e.g. 80G")
      ->capture_default_str();
  cmd.add_option("--save-grads", opt->save_grads,
                 "write the fp32 gradients (summed over ranks) as FILE.safetensors");
  cmd.add_flag("--offload-checkpoints", opt->offload_checkpoints,
               "keep the layer checkpoints in the host arena, fetched back one layer ahead");
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
