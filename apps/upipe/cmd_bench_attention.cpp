// `upipe bench attention`: times forward + backward of one strategy across the ranks of the
// job (after a warm-up iteration), and reports time, throughput and memory; with --meta-ranks
// it plans the same configuration on the meta device instead.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "attention/harness.h"
#include "attention/methods.h"
#include "comm/fake/fake_comm.h"
#include "core/errors.h"
#include "core/watchdog.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  int iters = 3;
  int meta_ranks = 0;
  bool json = false;
};

// --meta-ranks C: plan instead of run. Rank 0 of C on the meta device (fake communicator):
// exact bytes and communication, no data, no timing.
int plan(const Options& opt, const AttentionConfig& cfg, int64_t budget) {
  Device dev({BackendKind::kMeta, budget, budget});
  FakeCommunicator comm(0, opt.meta_ranks);
  auto strat = make_strategy({dev, comm, cfg});
  BlockTensors t = make_block_tensors(dev, cfg, strat->layout().positions(0), 1);
  const BlockRun r = run_block(*strat, dev, t);
  nlohmann::json j = config_json(cfg);
  j.update({{"ranks", opt.meta_ranks},
            {"device", "meta"},
            {"peak_bytes", r.peak_bytes},
            {"peak_by_tag", tags_json(r.peak_by_tag)},
            {"attn_peak_bytes", r.attn_peak_bytes},
            {"attn_formula_bytes", strat->attn_formula_bytes()},
            {"comm", comm_json(comm.stats())}});
  if (opt.json) {
    print_json(j);
  } else {
    std::printf(
        "%s planned for rank 0 of %d, S=%lld: peak %s, attention intermediates %s, "
        "%lld collective calls sending %s\n",
        cfg.knobs.method.c_str(), opt.meta_ranks, (long long)cfg.seq_len,
        format_bytes(r.peak_bytes).c_str(), format_bytes(r.attn_peak_bytes).c_str(),
        (long long)comm.stats().total_calls(), format_bytes(comm.stats().total_bytes()).c_str());
  }
  return 0;
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const RunConfig set = resolve_settings(proc, sa, cmd).config;
  Watchdog::start(set.comm.timeout);
  const AttentionConfig cfg = opt.shape.config(set);
  const int64_t budget = set.memory.device_bytes;
  if (opt.meta_ranks > 0) return proc.root() ? plan(opt, cfg, budget) : 0;
  Device dev({BackendKind::kCpu, budget, budget});
  auto strat = make_strategy({dev, proc.world, cfg});
  BlockTensors t = make_block_tensors(dev, cfg, strat->layout().positions(proc.rank()), 1);
  run_block(*strat, dev, t);  // warm-up
  double fwd = 1e30, bwd = 1e30;
  BlockRun last;
  for (int i = 0; i < opt.iters; ++i) {
    proc.world.barrier();
    last = run_block(*strat, dev, t);
    // The slowest rank sets the pace.
    float times[2] = {float(last.fwd_s), float(last.bwd_s)};
    proc.world.all_reduce(times, 2, DType::kF32, ReduceOp::kMax);
    fwd = std::min(fwd, double(times[0]));
    bwd = std::min(bwd, double(times[1]));
  }
  std::vector<int64_t> mine{last.peak_bytes, last.attn_peak_bytes},
      all(size_t(2 * proc.world.size()));
  proc.world.all_gather(mine.data(), all.data(), 2 * sizeof(int64_t));
  int64_t peak = 0, attn = 0;
  for (int j = 0; j < proc.world.size(); ++j) {
    peak = std::max(peak, all[size_t(2 * j)]);
    attn = std::max(attn, all[size_t(2 * j + 1)]);
  }
  if (!proc.root()) return 0;
  const double tps = double(cfg.seq_len) / (fwd + bwd);
  nlohmann::json j = config_json(cfg);
  j.update({{"ranks", proc.world.size()},
            {"iters", opt.iters},
            {"fwd_s", fwd},
            {"bwd_s", bwd},
            {"tokens_per_s", tps},
            {"peak_bytes", peak},
            {"peak_by_tag", tags_json(last.peak_by_tag)},
            {"attn_peak_bytes", attn},
            {"attn_formula_bytes", strat->attn_formula_bytes()}});
  if (opt.json) {
    print_json(j);
  } else {
    std::printf("%s on %d rank(s), S=%lld: forward %.3f s, backward %.3f s, %.0f tokens/s\n",
                cfg.knobs.method.c_str(), proc.world.size(), (long long)cfg.seq_len, fwd, bwd, tps);
    std::printf("  peak %s, attention intermediates %s (formula %s)\n", format_bytes(peak).c_str(),
                format_bytes(attn).c_str(), format_bytes(strat->attn_formula_bytes()).c_str());
  }
  return 0;
}

}  // namespace

Runner add_bench_attention(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_shape_options(cmd, opt->shape, true);
  cmd.add_option("--iters", opt->iters, "timed iterations (minimum reported)")
      ->capture_default_str()
      ->check(integer_in<int>(1, kMaxIters));
  cmd.add_option("--meta-ranks", opt->meta_ranks,
                 "plan on the meta device as rank 0 of this many ranks (no data, no timing)")
      ->check(integer_in<int>(0, kMaxRanks));
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  auto sa = add_settings(cmd, kScopeBlock);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
