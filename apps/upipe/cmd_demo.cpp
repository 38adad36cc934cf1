// `upipe demo`: the built-in demonstration `make demo` runs (under mpirun, 2 ranks). On the
// job's ranks: (1) UPipe and Ulysses checked against `local`; (2) both timed forward + backward
// at a few sequence lengths, with the measured attention-intermediate peak next to its formula;
// (3) the exact per-rank peak of a Llama-3-8B attention block at up to millions of tokens on 8
// ranks, planned on the meta device (nothing allocated, same code path).
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/settings_cli.h"
#include "attention/check.h"
#include "attention/harness.h"
#include "attention/methods.h"
#include "attention/upipe_schedule.h"
#include "comm/fake/fake_comm.h"
#include "core/watchdog.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  std::vector<int64_t> seq_lens{2048, 4096, 8192};
};

int64_t planned_attn_peak(const std::string& method, AttentionConfig cfg, int ranks) {
  Device dev({BackendKind::kMeta, int64_t(1) << 50, int64_t(1) << 50});
  FakeCommunicator comm(0, ranks);
  cfg.knobs = {method};
  auto s = make_strategy({dev, comm, cfg});
  BlockTensors t = make_block_tensors(dev, cfg, s->layout().positions(0), 1);
  return run_block(*s, dev, t).attn_peak_bytes;
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  RunConfig set = resolve_settings(proc, sa, cmd).config;
  Watchdog::start(set.comm.timeout);
  // The block of each method at S tokens.
  auto config = [&](int64_t s, const std::string& method) {
    set.train.seq_len = s;
    set.parallel.knobs = {method};
    return opt.shape.config(set);
  };
  // Refuse bad input before any work, naming the flag it came from.
  for (int64_t s : opt.seq_lens) try {
      config(s, "upipe");
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("--seq-lens {}: {}", s, e.what()));
    }

  const int c = proc.world.size();
  const int64_t check_s = (1024 + c - 1) / c * c;  // the check's S: 1024, or the next multiple of C
  // The heads first (upipe's U = C): a length that divides is no help where they cannot split.
  make_upipe_schedule(config(check_s, "upipe"), c, 0);
  for (int64_t s : opt.seq_lens)
    if (s % c != 0)
      throw ConfigError(fmt::format(
          "--seq-lens {} must be divisible by {} (the number of ranks); try --seq-lens {}", s, c,
          (s / c + 1) * c));
  const bool root = proc.root();
  const std::vector<std::string> methods = c == 1 ? std::vector<std::string>{"local", "upipe"}
                                                  : std::vector<std::string>{"ulysses", "upipe"};
  if (root)
    std::printf(
        "upipe demo on %d rank(s), one thread each. Attention block H=%d K=%d d=%d %s;\n"
        "upipe runs U=C=%d query heads per stage.\n\n",
        c, opt.shape.heads, opt.shape.kv_heads, opt.shape.head_dim,
        dtype_name(set.memory.policy.dtype), c);

  // 1. Correctness against the single-rank oracle.
  int failures = 0;
  for (const std::string& m : methods) {
    if (m == "local") continue;
    const CheckResult r = check_strategy(config(check_s, m), proc.world);
    failures += r.passed ? 0 : 1;
    if (root)
      std::printf(
          "check %-8s vs local, S=%lld: %s (max |err| y %.1e, dx %.1e, dWq %.1e; "
          "measured intermediates %s = formula %s)\n",
          m.c_str(), (long long)check_s, r.passed ? "PASSED" : "FAILED", r.max_abs_err.at("y"),
          r.max_abs_err.at("dx"),
          r.max_abs_err.at("dwq"), format_bytes(r.attn_peak_bytes).c_str(),
          format_bytes(r.attn_formula_bytes).c_str());
  }

  // 2. Measured forward + backward.
  if (root)
    std::printf("\n%8s %-8s %9s %9s %11s %14s %14s\n", "S", "method", "fwd s", "bwd s", "tokens/s",
                "attn peak", "formula");
  for (int64_t s : opt.seq_lens) {
    for (const std::string& m : methods) {
      const AttentionConfig cfg = config(s, m);
      Device dev;
      auto strat = make_strategy({dev, proc.world, cfg});
      BlockTensors t = make_block_tensors(dev, cfg, strat->layout().positions(proc.rank()), 1);
      run_block(*strat, dev, t);  // warm-up
      proc.world.barrier();
      const BlockRun r = run_block(*strat, dev, t);
      float times[2] = {float(r.fwd_s), float(r.bwd_s)};
      proc.world.all_reduce(times, 2, DType::kF32, ReduceOp::kMax);
      if (root)
        std::printf("%8lld %-8s %9.3f %9.3f %11.0f %14s %14s\n", (long long)s, m.c_str(), times[0],
                    times[1], double(s) / (times[0] + times[1]),
                    format_bytes(r.attn_peak_bytes).c_str(),
                    format_bytes(strat->attn_formula_bytes()).c_str());
      failures += r.attn_peak_bytes == strat->attn_formula_bytes() ? 0 : 1;
    }
  }

  // 3. Planned on the meta device: Llama-3-8B attention, bf16, 8 ranks.
  if (root) {
    AttentionConfig big;
    big.heads = 32;
    big.kv_heads = 8;
    big.head_dim = 128;
    big.dtype = DType::kBF16;
    big.fp32_residual = true;  // the default residual stream (--residual-dtype fp32), as bench's
    big.rope.theta = 500000.0;
    std::printf(
        "\nPlanned on the meta device (exact, nothing allocated): Llama-3-8B attention block\n"
        "(H=32 K=8 d=128, bf16, fp32 residual stream), 8 ranks, per-rank attention "
        "intermediates:\n");
    std::printf("%10s %14s %14s %8s\n", "S", "ulysses", "upipe U=8", "ratio");
    for (int64_t s : {int64_t(128) << 10, int64_t(512) << 10, int64_t(1) << 20, int64_t(4) << 20}) {
      big.seq_len = s;
      const int64_t u = planned_attn_peak("ulysses", big, 8),
                    p = planned_attn_peak("upipe", big, 8);
      std::printf("%9lldK %14s %14s %8.2f\n", (long long)(s >> 10), format_bytes(u).c_str(),
                  format_bytes(p).c_str(), double(p) / double(u));
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

Runner add_demo(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  opt->shape.heads = 16;
  opt->shape.kv_heads = 4;
  add_shape_options(cmd, opt->shape, false);
  cmd.add_option("--seq-lens", opt->seq_lens, "sequence lengths to time")
      ->check(integer_in<int64_t>(2, kMaxSeqLen));
  auto sa = add_settings(cmd, kScopeDemo);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
