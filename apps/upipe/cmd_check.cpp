// `upipe check`: runs a strategy forward + backward on random inputs across the ranks of the
// job, compares y, dx and the weight gradients with `local` on the gathered sequence, and
// reports errors, tolerances, the measured and documented attention-intermediate peaks and the
// communication counts. With --doc-lens the sequence is packed documents and the comparison is
// with each document run alone through `local`. Exit status 0 exactly when the comparison passed.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "attention/check.h"
#include "attention/methods.h"
#include "core/watchdog.h"
#include "model/doc_lens.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  std::string doc_lens;
  bool json = false;
};

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const RunConfig set = resolve_settings(proc, sa, cmd).config;
  Watchdog::start(set.comm.timeout);
  const AttentionConfig cfg = opt.shape.config(set);
  CheckOptions co;
  co.seed = uint64_t(set.train.seed);
  co.device_budget = set.memory.device_bytes;
  co.backend = parse_backend_kind(set.device.backend);
  if (const auto docs = documents_from(opt.doc_lens, cfg.seq_len)) co.doc_lens = docs->lengths();
  const CheckResult r = check_strategy(cfg, proc.world, co);
  if (proc.root()) {
    nlohmann::json j = config_json(cfg, proc.world.size());
    j.update({{"ranks", r.ranks},
              {"documents", std::max<size_t>(1, co.doc_lens.size())},
              {"max_abs_err", r.max_abs_err},
              {"tolerance", r.tolerance},
              {"tolerance_rule", r.rule},
              {"passed", r.passed},
              {"peak_bytes", r.peak_bytes},
              {"peak_by_tag", tags_json(r.peak_by_tag)},
              {"attn_peak_bytes", r.attn_peak_bytes},
              {"attn_formula_bytes", r.attn_formula_bytes},
              {"host_peak_bytes", r.host_peak_bytes},
              {"host_formula_bytes", r.host_formula_bytes},
              {"comm", comm_json(r.comm)},
              {"backend", backend_kind_name(co.backend)},
              {"communicator", r.communicator},
              {"fwd_s", r.fwd_s},
              {"bwd_s", r.bwd_s}});
    if (r.comm_expected) j["comm_expected"] = comm_json(*r.comm_expected);
    if (opt.json) {
      print_json(j);
    } else {
      const std::string knobs = knobs_text(cfg, r.ranks);  // "U=4 overlap"; "-" for none
      std::printf("%s%s on %d rank(s)%s: %s\n", r.method.c_str(),
                  knobs == "-" ? "" : (" (" + knobs + ")").c_str(), r.ranks,
                  co.doc_lens.size() > 1
                      ? fmt::format(", {} documents vs each alone", co.doc_lens.size()).c_str()
                      : "",
                  r.passed ? "PASSED" : "FAILED");
      for (const auto& [k, v] : r.max_abs_err)
        std::printf("  %-4s max |err| %.3e  (tolerance %.3e)\n", k.c_str(), v, r.tolerance.at(k));
      std::printf("  attention intermediates: measured %s, formula %s%s\n",
                  format_bytes(r.attn_peak_bytes).c_str(),
                  format_bytes(r.attn_formula_bytes).c_str(),
                  r.attn_peak_bytes == r.attn_formula_bytes ? " (equal)" : " (DIFFERENT)");
      if (r.host_peak_bytes > 0 || r.host_formula_bytes > 0)
        std::printf("  host memory (offloaded K/V chunks): measured %s, formula %s%s\n",
                    format_bytes(r.host_peak_bytes).c_str(),
                    format_bytes(r.host_formula_bytes).c_str(),
                    r.host_peak_bytes == r.host_formula_bytes ? " (equal)" : " (DIFFERENT)");
      std::printf("  peak %s; forward %.3f s, backward %.3f s\n",
                  format_bytes(r.peak_bytes).c_str(), r.fwd_s, r.bwd_s);
    }
  }
  return r.passed ? 0 : 1;
}

}  // namespace

Runner add_check(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  add_shape_options(cmd, opt->shape, true);
  add_doc_lens_option(
      cmd, opt->doc_lens,
      "packed documents: lengths a,b,c summing to --seq-len, or a .npy/.bin file of them; "
      "compared with each document alone through local");
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  auto sa = add_settings(cmd, kScopeBlock);
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
