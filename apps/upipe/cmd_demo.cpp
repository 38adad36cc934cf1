// `upipe demo`: the built-in demonstration `make demo` runs. The `local` attention block,
// forward + backward, at a few sequence lengths on this CPU, with time and the peak memory
// broken down by tag.
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "attention/harness.h"
#include "core/errors.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  std::vector<int64_t> seq_lens{1024, 2048, 4096};
};

int run(Process& proc, const Options& opt) {
  if (proc.world.size() != 1)
    throw ConfigError("the demo runs on one rank; start it without mpirun");
  std::printf("upipe demo: the `local` attention block (H=%d, K=%d, d=%d, %s), forward + backward,\n"
              "one rank, one thread. Peak = device-arena peak; the columns break the attention\n"
              "intermediates at that peak down by tag; formula = documented closed form.\n\n",
              opt.shape.heads, opt.shape.kv_heads, opt.shape.head_dim, opt.shape.dtype.c_str());
  std::printf("%8s %9s %9s %11s %11s %11s %11s %11s %11s %11s\n", "S", "fwd s", "bwd s",
              "tokens/s", "peak", "qkv", "attn_out", "attn_grad", "workspace", "formula");
  for (int64_t s : opt.seq_lens) {
    ShapeOptions so = opt.shape;
    so.seq_len = s;
    const AttentionConfig cfg = so.config();
    Device dev;
    auto strat = make_strategy("local", {dev, proc.world, cfg});
    BlockTensors t = make_block_tensors(dev, cfg, strat->layout().positions(0), 1);
    run_block(*strat, dev, t);  // warm-up: pages faulted in, oneDNN kernels generated
    const BlockRun r = run_block(*strat, dev, t);
    auto b = [&](Tag tag) { return format_bytes(r.peak_by_tag[tag]); };
    std::printf("%8lld %9.3f %9.3f %11.0f %11s %11s %11s %11s %11s %11s%s\n", (long long)s, r.fwd_s,
                r.bwd_s, double(s) / (r.fwd_s + r.bwd_s), format_bytes(r.peak_bytes).c_str(),
                b(Tag::kQkv).c_str(), b(Tag::kAttnOut).c_str(), b(Tag::kAttnGrad).c_str(),
                b(Tag::kWorkspace).c_str(), format_bytes(strat->attn_formula_bytes()).c_str(),
                r.attn_peak_bytes == strat->attn_formula_bytes() ? "" : "  (MISMATCH)");
    if (r.attn_peak_bytes != strat->attn_formula_bytes()) return 1;
  }
  return 0;
}

}  // namespace

Runner add_demo(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_shape_options(cmd, opt->shape, false);
  cmd.add_option("--seq-lens", opt->seq_lens, "sequence lengths to run");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
