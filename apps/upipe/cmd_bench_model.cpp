// `upipe bench model`: times one training step of the whole decoder (forward to the loss and
// backward to every gradient, with full activation checkpointing) on S random tokens split over
// the job's ranks with any attention strategy. One warm-up step, then --iters timed steps; each
// step's time is the slowest rank's, and the median is reported with tokens/s, the per-rank peak
// memory by tag, and two FLOP rates against this machine's GEMM rate measured in the same run: the
// model FLOPs of MFU (train/flops.h: what the model needs) and the FLOPs the step executed
// (backend/work_count.h: the recompute and the strategies' passes included; HFU). Before timing it
// checks the loss is finite, and that every step gives the same loss and executes the same work
// (the step is deterministic). Memory: the decoder's step alone, every rank holding the whole
// model's weights and gradients (no ZeRO, no optimizer), so its peak is not a training step's:
// `upipe plan` and `upipe train` give that one.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "attention/methods.h"
#include "backend/cpu/cpu_isa.h"
#include "core/errors.h"
#include "core/watchdog.h"
#include "train/flops.h"

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

// Exact for the integers a step's FLOP counts are (below 2^53): gathered, summed in rank order.
double sum_over_ranks(Communicator& world, double v) {
  std::vector<double> all(static_cast<size_t>(world.size()));
  world.all_gather(&v, all.data(), sizeof(double));
  double sum = 0;
  for (double x : all) sum += x;
  return sum;
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const Settings set = resolve_settings(proc, sa, cmd);
  const RunConfig& cfg = set.config;
  Watchdog::start(cfg.comm.timeout);
  refuse_training_checkpoint(cfg.model.name);
  const ModelConfig m = load_model_config(cfg.model.name);
  spell_model_fields(set, m);
  const int64_t seq_len = cfg.train.seq_len;
  AttentionConfig attn = to_attention_config(m);
  attn.seq_len = seq_len;
  attn.knobs = cfg.parallel.knobs;
  ModelRun run(proc.world, m, cfg, seq_len);  // sizes no budget holds are refused here first
  const std::vector<int32_t> tokens = random_tokens(m, seq_len, uint64_t(cfg.train.seed));
  Device& dev = run.dev;
  const GemmRate gemm = measure_job_gemm_rate(proc.world, dev, cfg.memory.policy.dtype, 1024, 5);
  dev.mem().reset_peak();
  dev.host().reset_peak();
  dev.work() = {};
  const double loss = run.dec->loss_and_grads(tokens, run.w, run.g);  // warm-up
  if (!std::isfinite(loss)) throw Error(fmt::format("the loss is {}, not finite", loss));
  const WorkCount work = dev.work();
  std::vector<double> fwd, bwd, step;
  for (int i = 0; i < opt.iters; ++i) {
    proc.world.barrier();
    dev.work() = {};
    const double again = run.dec->loss_and_grads(tokens, run.w, run.g);
    if (again != loss)
      throw Error(fmt::format("step {} gave loss {:.17g}, the warm-up {:.17g}: not deterministic",
                              i + 1, again, loss));
    if (dev.work().flops() != work.flops())
      throw Error(fmt::format("step {} executed {} FLOPs, the warm-up {}: not deterministic", i + 1,
                              dev.work().flops(), work.flops()));
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
  // What the ranks executed together: GEMM, attention, and the uncounted document calls.
  const double executed[3] = {sum_over_ranks(proc.world, work.gemm_flops),
                              sum_over_ranks(proc.world, work.attention_flops),
                              sum_over_ranks(proc.world, double(work.attention_uncounted))};
  if (!proc.root()) return 0;
  const double ranks = double(proc.world.size());
  const double t = median(step), tps = double(seq_len) / t;
  const double model = training_flops_per_sequence(m, seq_len);
  const double per_rank = (executed[0] + executed[1]) / ranks;
  const double mfu = gemm.flops_per_s > 0 ? model / ranks / t / gemm.flops_per_s : 0;
  const double hfu = gemm.flops_per_s > 0 ? per_rank / t / gemm.flops_per_s : 0;
  nlohmann::json j = {{"model", m.source},
                      {"method", cfg.parallel.knobs.method},
                      {"knobs",
                       {{"stage_heads", cfg.parallel.knobs.stage_heads},
                        {"ulysses_degree", cfg.parallel.knobs.ulysses_degree},
                        {"chunks", cfg.parallel.knobs.chunks},
                        {"overlap", cfg.parallel.knobs.overlap}}},
                      {"resolved_knobs", resolved_knobs_json(attn, proc.world.size())},
                      {"knobs_text", knobs_text(attn, proc.world.size())},
                      {"ranks", proc.world.size()},
                      {"seq_len", seq_len},
                      {"parameters", parameter_count(m)},
                      {"iters", opt.iters},
                      {"loss", loss},
                      {"step_s", t},
                      {"fwd_s", median(fwd)},
                      {"bwd_s", median(bwd)},
                      {"tokens_per_s", tps},
                      {"model_flops", model},
                      {"model_tflops_per_s", model / t * 1e-12},
                      {"executed_gemm_flops", executed[0]},
                      {"executed_attention_flops", executed[1]},
                      {"executed_attention_uncounted", int64_t(executed[2])},
                      {"executed_tflops_per_s_per_rank", per_rank / t * 1e-12},
                      {"gemm_tflops_per_s", gemm.flops_per_s * 1e-12},
                      {"gemm_n", gemm.n},
                      {"mfu", mfu},
                      {"hfu", hfu},
                      // The decoder's step with the whole model on every rank (not a training
                      // step's: no ZeRO shards, no optimizer state).
                      {"peak_bytes", peak},
                      {"peak_scope", "forward+backward, weights and gradients whole on every rank"},
                      {"peak_by_tag", tags_json(dev.mem().at_peak_by_tag())},
                      {"host_peak_bytes", host_peak},
                      {"cpu", cpu_model_name()}};
  j.update(memory_policy_json(cfg.memory.policy));
  if (opt.json) {
    print_json(j);
  } else {
    std::printf("%s, %lld tokens, %s%s on %d rank(s), %s, CPU kernels %s: loss %.6f\n",
                m.source.c_str(), (long long)seq_len, cfg.parallel.knobs.method.c_str(),
                knobs_text(attn, proc.world.size()) == "-"
                    ? ""
                    : (" (" + knobs_text(attn, proc.world.size()) + ")").c_str(),
                proc.world.size(), dtype_name(cfg.memory.policy.dtype), cpu_isa_name(cpu_isa()),
                loss);
    std::printf("  step %.3f s (forward %.3f s, backward %.3f s; median of %d), %.0f tokens/s\n", t,
                median(fwd), median(bwd), opt.iters, tps);
    std::printf("  GEMM rate %.1f GFLOP/s per rank (%lld^3 %s, measured now)\n",
                gemm.flops_per_s * 1e-9, (long long)gemm.n, dtype_name(cfg.memory.policy.dtype));
    std::printf("  model     %8.2f GFLOP per step, %7.1f GFLOP/s per rank, MFU %.0f%%\n",
                model * 1e-9, model / ranks / t * 1e-9, 100 * mfu);
    std::printf(
        "  executed  %8.2f GFLOP per rank (GEMM %.2f, attention %.2f), %7.1f GFLOP/s per "
        "rank, HFU %.0f%%\n",
        per_rank * 1e-9, executed[0] / ranks * 1e-9, executed[1] / ranks * 1e-9,
        per_rank / t * 1e-9, 100 * hfu);
    if (executed[2] > 0)
      std::printf("  (%lld attention calls with document masks are not in the executed count)\n",
                  (long long)executed[2]);
    std::printf("  peak %s per rank (max); rank 0's at its peak: %s\n", format_bytes(peak).c_str(),
                Arena::describe(dev.mem().at_peak_by_tag()).c_str());
    std::printf(
        "  (the whole model's weights and gradients on every rank, no optimizer: a training "
        "step's peak, ZeRO-3 shards and AdamW, is upipe plan's and upipe train's)\n");
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
