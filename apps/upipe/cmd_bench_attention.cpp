// `upipe bench attention`: times forward + backward of one strategy across the ranks of the
// job (after a warm-up iteration), and reports time, throughput and memory; with --meta-ranks
// it plans the same configuration on the meta device instead. With --doc-lens the sequence is
// packed documents, and the one-document time of the same S is measured and reported beside it.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "attention/device_comm.h"
#include "attention/harness.h"
#include "attention/methods.h"
#include "comm/fake/fake_comm.h"
#include "core/errors.h"
#include "core/watchdog.h"
#include "model/doc_lens.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  std::string doc_lens;
  bool no_one_document = false;  // --doc-lens without the one-document comparison
  int iters = 3;
  int meta_ranks = 0;
  bool json = false;
};

// --meta-ranks C: plan instead of run. Rank 0 of C on the meta device (fake communicator):
// exact bytes and communication, no data, no timing.
int plan(const Options& opt, const AttentionConfig& cfg, int64_t budget, BackendKind target,
         const std::shared_ptr<const Documents>& docs) {
  Device dev({BackendKind::kMeta, budget, budget, target});
  FakeCommunicator comm(0, opt.meta_ranks);
  auto strat = make_strategy({dev, comm, cfg});
  strat->set_documents(docs);
  BlockTensors t = make_block_tensors(dev, cfg, strat->layout().positions(0), 1);
  const BlockRun r = run_block(*strat, dev, t);
  nlohmann::json j = config_json(cfg, opt.meta_ranks);
  j.update({{"ranks", opt.meta_ranks},
            {"device", "meta"},
            {"plans_for", backend_kind_name(target)},
            {"peak_bytes", r.peak_bytes},
            {"peak_by_tag", tags_json(r.peak_by_tag)},
            {"attn_peak_bytes", r.attn_peak_bytes},
            {"attn_formula_bytes", strat->attn_formula_bytes()},
            {"host_peak_bytes", r.host_peak_bytes},
            {"host_formula_bytes", strat->host_formula_bytes()},
            {"comm", comm_json(comm.stats())}});
  if (opt.json) {
    print_json(j);
  } else {
    std::printf(
        "%s (%s) planned for rank 0 of %d, S=%lld: peak %s, attention intermediates %s, "
        "%lld collective calls sending %s%s\n",
        cfg.knobs.method.c_str(), knobs_text(cfg, opt.meta_ranks).c_str(), opt.meta_ranks,
        (long long)cfg.seq_len, format_bytes(r.peak_bytes).c_str(),
        format_bytes(r.attn_peak_bytes).c_str(), (long long)comm.stats().total_calls(),
        format_bytes(comm.stats().total_bytes()).c_str(),
        r.host_peak_bytes > 0
            ? fmt::format("; host memory {}", format_bytes(r.host_peak_bytes)).c_str()
            : "");
  }
  return 0;
}

// The minimum over opt.iters runs (after a warm-up) of the slowest rank's forward and backward
// times, the max over ranks of the peaks, and the formula, for the strategy's current documents.
struct Timing {
  double fwd = 1e30, bwd = 1e30;
  int64_t peak = 0, attn = 0, formula = 0;
  int64_t host = 0, host_formula = 0;  // the host arena (fpdt's offloaded K/V chunks)
  TagBytes peak_by_tag;
  CommStats comm;  // rank 0's collectives in the last timed forward + backward
  int64_t driver_warm = -1, driver_end = -1;  // GPU: cudaMemGetInfo's bytes in use
};

Timing time_block(Process& proc, AttentionStrategy& strat, Device& dev, Communicator& comm,
                  const AttentionConfig& cfg, int iters) {
  BlockTensors t = make_block_tensors(dev, cfg, strat.layout().positions(proc.rank()), 1);
  run_block(strat, dev, t);  // warm-up
  Timing r;
  // On a GPU: the driver's bytes in use after the warm-up (the arena holds its one reservation
  // by then) and after the timed steps; a difference is memory allocated outside the arena
  // (cuBLASLt, cuDNN, NCCL), which no plan can see.
  const bool gpu = dev.backend().kind() == BackendKind::kCuda;
  if (gpu) r.driver_warm = cuda_driver_used_bytes();
  BlockRun last;
  for (int i = 0; i < iters; ++i) {
    proc.world.barrier();
    comm.reset_stats();
    last = run_block(strat, dev, t);
    r.comm = comm.stats();  // before the timing's reduction (the same communicator on a CPU)
    // The slowest rank sets the pace.
    float times[2] = {float(last.fwd_s), float(last.bwd_s)};
    proc.world.all_reduce(times, 2, DType::kF32, ReduceOp::kMax);
    r.fwd = std::min(r.fwd, double(times[0]));
    r.bwd = std::min(r.bwd, double(times[1]));
  }
  std::vector<int64_t> mine{last.peak_bytes, last.attn_peak_bytes, last.host_peak_bytes},
      all(size_t(3 * proc.world.size()));
  proc.world.all_gather(mine.data(), all.data(), 3 * sizeof(int64_t));
  for (int j = 0; j < proc.world.size(); ++j) {
    r.peak = std::max(r.peak, all[size_t(3 * j)]);
    r.attn = std::max(r.attn, all[size_t(3 * j + 1)]);
    r.host = std::max(r.host, all[size_t(3 * j + 2)]);
  }
  r.peak_by_tag = last.peak_by_tag;
  r.formula = strat.attn_formula_bytes();
  r.host_formula = strat.host_formula_bytes();
  if (gpu) r.driver_end = cuda_driver_used_bytes();
  return r;
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const RunConfig set = resolve_settings(proc, sa, cmd).config;
  Watchdog::start(set.comm.timeout);
  const AttentionConfig cfg = opt.shape.config(set);
  const int64_t budget = set.memory.device_bytes;
  const std::shared_ptr<const Documents> docs = documents_from(opt.doc_lens, cfg.seq_len);
  const BackendKind kind = parse_backend_kind(set.device.backend);
  if (opt.meta_ranks > 0) return proc.root() ? plan(opt, cfg, budget, kind, docs) : 0;
  Device dev({kind, budget, budget});
  DeviceComm comm(dev, proc.world);
  auto strat = make_strategy({dev, comm, cfg});
  strat->set_documents(docs);
  const Timing r = time_block(proc, *strat, dev, comm.get(), cfg, opt.iters);
  std::optional<Timing> one;  // the same S as one document
  if (packed(docs) && !opt.no_one_document) {
    strat->set_documents(nullptr);
    one = time_block(proc, *strat, dev, comm.get(), cfg, opt.iters);
  }
  if (!proc.root()) return 0;
  const double tps = double(cfg.seq_len) / (r.fwd + r.bwd);
  nlohmann::json j = config_json(cfg, proc.world.size());
  j.update({{"ranks", proc.world.size()},
            {"backend", backend_kind_name(kind)},
            {"iters", opt.iters},
            {"documents", docs ? docs->count() : 1},
            {"fwd_s", r.fwd},
            {"bwd_s", r.bwd},
            {"tokens_per_s", tps},
            {"peak_bytes", r.peak},
            {"peak_by_tag", tags_json(r.peak_by_tag)},
            {"attn_peak_bytes", r.attn},
            {"attn_formula_bytes", r.formula},
            {"host_peak_bytes", r.host},
            {"host_formula_bytes", r.host_formula},
            {"comm", comm_json(r.comm)}});
  if (kind == BackendKind::kCuda) {
    j["driver_used_bytes_after_warmup"] = r.driver_warm;
    j["driver_used_bytes_after_timed"] = r.driver_end;
    j["driver_bytes_outside_arena"] = r.driver_end - r.driver_warm;
  }
  if (one) {
    j["one_document"] = {{"fwd_s", one->fwd}, {"bwd_s", one->bwd}, {"attn_peak_bytes", one->attn}};
    j["speedup"] = (one->fwd + one->bwd) / (r.fwd + r.bwd);
  }
  if (opt.json) {
    print_json(j);
    return 0;
  }
  std::printf("%s (%s) on %d rank(s), S=%lld%s: forward %.3f s, backward %.3f s, %.0f tokens/s\n",
              cfg.knobs.method.c_str(), knobs_text(cfg, proc.world.size()).c_str(),
              proc.world.size(), (long long)cfg.seq_len,
              docs ? fmt::format(", {} documents", docs->count()).c_str() : "", r.fwd, r.bwd, tps);
  std::printf("  peak %s, attention intermediates %s (formula %s)\n", format_bytes(r.peak).c_str(),
              format_bytes(r.attn).c_str(), format_bytes(r.formula).c_str());
  if (r.host > 0 || r.host_formula > 0)
    std::printf("  host memory (offloaded K/V chunks) %s (formula %s)\n",
                format_bytes(r.host).c_str(), format_bytes(r.host_formula).c_str());
  if (one)
    std::printf("  one document of %lld: forward %.3f s, backward %.3f s; %.1fx faster packed\n",
                (long long)cfg.seq_len, one->fwd, one->bwd,
                (one->fwd + one->bwd) / (r.fwd + r.bwd));
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
  add_doc_lens_option(
      cmd, opt->doc_lens,
      "packed documents: lengths a,b,c summing to --seq-len, or a .npy/.bin file of them; "
      "the one-document time of the same S is reported beside");
  cmd.add_flag("--no-one-document", opt->no_one_document,
               "with --doc-lens: skip timing the same S as one document");
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  auto sa = add_settings(cmd, kScopeBlock);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
