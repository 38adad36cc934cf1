// `upipe bench model`: times one training step of the whole decoder (forward to the loss and
// backward to every gradient, with full activation checkpointing) on S random tokens split over
// the job's ranks with any attention strategy. One warm-up step, then --iters timed steps; each
// step's time is the slowest rank's, and the median is reported with tokens/s, the model FLOP
// rate and the per-rank peak memory by tag. Before timing it checks the loss is finite, and that
// every step gives the same loss (the step is deterministic).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "backend/cpu/cpu_isa.h"
#include "core/errors.h"
#include "core/watchdog.h"

namespace upipe::app {
namespace {

struct Options {
  int iters = 3;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// FLOPs of one step without the recompute (the "model FLOPs" of MFU): 6 per parameter of every
// matrix product per token (the embedding is a lookup), and causal attention's 2*S^2*H*d forward
// with a backward of 2.5x that (docs/kernels.md), per layer.
double model_flops(const ModelConfig& m, int64_t s) {
  const double matmul = double(m.num_hidden_layers) * double(layer_parameter_count(m)) +
                        double(m.vocab_size) * double(m.hidden_size);
  const double attn = 3.5 * 2.0 * double(s) * double(s) * double(m.q_dim());
  return 6.0 * matmul * double(s) + double(m.num_hidden_layers) * attn;
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const Settings set = resolve_settings(proc, sa, cmd);
  const RunConfig& cfg = set.config;
  Watchdog::start(cfg.comm.timeout);
  refuse_training_checkpoint(cfg.model.name);
  const ModelConfig m = load_model_config(cfg.model.name);
  spell_model_fields(set, m);
  const int64_t seq_len = cfg.train.seq_len;
  const std::vector<int32_t> tokens = random_tokens(m, seq_len, uint64_t(cfg.train.seed));
  ModelRun run(proc.world, m, cfg, seq_len);
  Device& dev = run.dev;
  dev.mem().reset_peak();
  dev.host().reset_peak();
  const double loss = run.dec->loss_and_grads(tokens, run.w, run.g);  // warm-up
  if (!std::isfinite(loss)) throw Error(fmt::format("the loss is {}, not finite", loss));
  std::vector<double> fwd, bwd, step;
  for (int i = 0; i < opt.iters; ++i) {
    proc.world.barrier();
    const double again = run.dec->loss_and_grads(tokens, run.w, run.g);
    if (again != loss)
      throw Error(fmt::format("step {} gave loss {:.17g}, the warm-up {:.17g}: not deterministic",
                              i + 1, again, loss));
    // The slowest rank sets the pace.
    float times[3] = {float(run.dec->forward_seconds()), float(run.dec->backward_seconds()),
                      float(run.dec->forward_seconds() + run.dec->backward_seconds())};
    proc.world.all_reduce(times, 3, DType::kF32, ReduceOp::kMax);
    fwd.push_back(times[0]);
    bwd.push_back(times[1]);
    step.push_back(times[2]);
  }
  const int64_t peak = max_over_ranks(proc.world, dev.mem().peak());
  const int64_t host_peak = max_over_ranks(proc.world, dev.host().peak());
  if (!proc.root()) return 0;
  const double t = median(step), tps = double(seq_len) / t;
  const double tflops = model_flops(m, seq_len) / t * 1e-12;
  nlohmann::json j = {{"model", m.source},
                      {"method", cfg.parallel.knobs.method},
                      {"ranks", proc.world.size()},
                      {"seq_len", seq_len},
                      {"parameters", parameter_count(m)},
                      {"iters", opt.iters},
                      {"loss", loss},
                      {"step_s", t},
                      {"fwd_s", median(fwd)},
                      {"bwd_s", median(bwd)},
                      {"tokens_per_s", tps},
                      {"model_tflops_per_s", tflops},
                      {"peak_bytes", peak},
                      {"peak_by_tag", tags_json(dev.mem().at_peak_by_tag())},
                      {"host_peak_bytes", host_peak},
                      {"cpu", cpu_model_name()}};
  j.update(memory_policy_json(cfg.memory.policy));
  if (opt.json) {
    print_json(j);
  } else {
    std::printf("%s, %lld tokens, %s on %d rank(s), %s, CPU kernels %s: loss %.6f\n",
                m.source.c_str(), (long long)seq_len, cfg.parallel.knobs.method.c_str(),
                proc.world.size(), dtype_name(cfg.memory.policy.dtype), cpu_isa_name(cpu_isa()),
                loss);
    std::printf(
        "  step %.3f s (forward %.3f s, backward %.3f s; median of %d), %.0f tokens/s, "
        "%.3f model TFLOP/s\n",
        t, median(fwd), median(bwd), opt.iters, tps, tflops);
    std::printf("  peak %s per rank (max)\n", format_bytes(peak).c_str());
  }
  return 0;
}

}  // namespace

Runner add_bench_model(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--iters", opt->iters, "timed steps after one warm-up (median reported)")
      ->capture_default_str()
      ->check(integer_in<int>(1, kMaxIters));
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  auto sa = add_settings(cmd, kScopeModel);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
