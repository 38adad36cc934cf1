// `upipe eval`: one forward + backward of a Llama-3 / Qwen3 model on one token sequence, split
// over the ranks of the job with any attention strategy: the loss (transformers' labels =
// input_ids mean), the gradient norms, time and per-rank memory; --save-grads writes every
// parameter's fp32 gradient (summed over the ranks) under its Hugging Face name.
#include <cmath>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/report.h"
#include "backend/optim.h"
#include "core/errors.h"
#include "core/safe_fs.h"
#include "model/decoder.h"
#include "model/safetensors.h"
#include "model/tokens.h"

namespace upipe::app {
namespace {

struct Options {
  ModelOptions model;
  std::string tokens;
  int64_t seq_len = 0;
  std::string save_grads;
  bool json = false;
};

int run(Process& proc, const Options& opt) {
  const ModelConfig m = load_model_config(opt.model.model);
  if (!opt.save_grads.empty()) check_replaceable(opt.save_grads, "gradients file");
  int64_t n = opt.seq_len;
  TokenFileInfo file;
  if (!opt.tokens.empty()) {
    file = inspect_token_file(opt.tokens);
    if (opt.seq_len > file.count)
      throw ConfigError(fmt::format("--seq-len {} is longer than the {} tokens of {}", opt.seq_len,
                                    file.count, opt.tokens));
    if (n <= 0) n = file.count;
    check_token_ids(file, n, m.vocab_size);
  } else if (opt.seq_len <= 0) {
    throw ConfigError("give --tokens FILE (.npy or .bin), or --seq-len S for random tokens");
  }
  if (n < 2) throw ConfigError("the sequence needs at least 2 tokens");
  ModelRun run(proc.world, m, opt.model, n);  // its sizes checked before anything is allocated
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  if (!opt.tokens.empty())
    read_token_range(file, 0, n, m.vocab_size, tokens.data());
  else  // no file: uniform random ids, the same on every rank
    tokens = random_tokens(m, n, opt.model.seed);
  Device& dev = run.dev;
  const ParamMap &w = run.w, &g = run.g;
  dev.mem().reset_peak();
  dev.host().reset_peak();
  const double loss = run.dec->loss_and_grads(tokens, w, g);
  const int64_t peak = dev.mem().peak(), host_peak = dev.host().peak();
  const TagBytes at_peak = dev.mem().at_peak_by_tag();
  // Full gradients: the sum of the ranks' contributions.
  nlohmann::json norms = nlohmann::json::object();
  double total = 0;
  // Summed in place on the device; --save-grads streams them from there (no host copies).
  std::vector<SafetensorsWriteItem> items;
  for (const auto& [name, t] : g) {
    proc.world.all_reduce(t.data(), t.mat().numel(), DType::kF32, ReduceOp::kSum);
    const double ss = sum_squares(dev, t);
    norms[name] = std::sqrt(ss);
    total += ss;
    if (!opt.save_grads.empty()) {
      const Mat flat{t.data(), DType::kF32, 1, t.mat().numel(), t.mat().numel()};  // contiguous
      SafetensorsWriteItem item{name, DType::kF32, {t.rows(), t.cols()}};
      if (t.rows() == 1) item.shape = {t.cols()};
      item.fill = [&dev, flat](int64_t first, int64_t count, void* dst) {
        dev.copy(dst, flat.at(0, first), mat_bytes(1, count, DType::kF32), CopyKind::kDeviceToHost);
      };
      items.push_back(std::move(item));
    }
  }
  const int64_t max_peak = max_over_ranks(proc.world, peak);
  if (!proc.root()) return 0;
  if (!opt.save_grads.empty()) write_safetensors(opt.save_grads, items, {{"format", "pt"}});
  nlohmann::json j = {{"model", m.source},
                      {"loss", loss},
                      {"tokens", tokens.size()},
                      {"method", opt.model.method},
                      {"ranks", proc.world.size()},
                      {"peak_bytes", max_peak},
                      {"peak_by_tag", tags_json(at_peak)},
                      {"host_peak_bytes", host_peak},
                      {"grad_norm", std::sqrt(total)},
                      {"grad_norms", norms},
                      {"fwd_s", run.dec->forward_seconds()},
                      {"bwd_s", run.dec->backward_seconds()}};
  j.update(memory_stack_json(opt.model));
  if (opt.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s, %zu tokens, %s on %d rank(s), %s\n", m.source.c_str(), tokens.size(),
                opt.model.method.c_str(), proc.world.size(), opt.model.dtype.c_str());
    std::printf("  loss %.8f  grad norm %.6e\n", loss, std::sqrt(total));
    std::printf("  forward %.3f s, backward %.3f s, peak %s per rank (max)\n",
                run.dec->forward_seconds(), run.dec->backward_seconds(),
                format_bytes(max_peak).c_str());
    if (!opt.save_grads.empty()) std::printf("  gradients written to %s\n", opt.save_grads.c_str());
  }
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_model_options(cmd, opt->model);
  cmd.add_option("--tokens", opt->tokens,
                 "token ids: a 1-D .npy (int32/int64/uint16/uint32) or an llm.c .bin");
  cmd.add_option("--seq-len,-S", opt->seq_len,
                 "tokens to use (default: all of --tokens; required without it)")
      ->check(integer_in<int64_t>(0, int64_t(1) << 40));
  cmd.add_option("--save-grads", opt->save_grads,
                 "write the fp32 gradients (summed over ranks) as FILE.safetensors");
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
