// `upipe check`: runs a strategy forward + backward on random inputs across the ranks of the
// job, compares y, dx and the weight gradients with `local` on the gathered sequence, and
// reports errors, tolerances, the measured and documented attention-intermediate peaks and the
// communication counts. Exit status 0 exactly when the comparison passed.
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "attention/check.h"

namespace upipe::app {
namespace {

struct Options {
  ShapeOptions shape;
  std::string method = "upipe";
  uint64_t seed = 1;
  std::string budget = "1T";
  bool json = false;
};

int run(Process& proc, const Options& opt) {
  const AttentionConfig cfg = opt.shape.config();
  CheckOptions co;
  co.seed = opt.seed;
  co.device_budget = parse_bytes(opt.budget);
  const CheckResult r = check_strategy(opt.method, cfg, proc.world, co);
  if (proc.root()) {
    nlohmann::json j = config_json(r.method, cfg);
    j.update({{"ranks", r.ranks},
              {"max_abs_err", r.max_abs_err},
              {"tolerance", r.tolerance},
              {"tolerance_rule", r.rule},
              {"passed", r.passed},
              {"peak_bytes", r.peak_bytes},
              {"peak_by_tag", tags_json(r.peak_by_tag)},
              {"attn_peak_bytes", r.attn_peak_bytes},
              {"attn_formula_bytes", r.attn_formula_bytes},
              {"comm", comm_json(r.comm)},
              {"fwd_s", r.fwd_s},
              {"bwd_s", r.bwd_s}});
    if (r.comm_expected) j["comm_expected"] = comm_json(*r.comm_expected);
    if (opt.json) {
      print_json(j);
    } else {
      std::printf("%s on %d rank(s): %s\n", r.method.c_str(), r.ranks,
                  r.passed ? "PASSED" : "FAILED");
      for (const auto& [k, v] : r.max_abs_err)
        std::printf("  %-4s max |err| %.3e  (tolerance %.3e)\n", k.c_str(), v, r.tolerance.at(k));
      std::printf("  attention intermediates: measured %s, formula %s%s\n",
                  format_bytes(r.attn_peak_bytes).c_str(),
                  format_bytes(r.attn_formula_bytes).c_str(),
                  r.attn_peak_bytes == r.attn_formula_bytes ? " (equal)" : " (DIFFERENT)");
      std::printf("  peak %s; forward %.3f s, backward %.3f s\n",
                  format_bytes(r.peak_bytes).c_str(), r.fwd_s, r.bwd_s);
    }
  }
  return r.passed ? 0 : 1;
}

}  // namespace

Runner add_check(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  opt->shape.seq_len = 1024;
  cmd.add_option("--method,-m", opt->method,
                 "local, ulysses, upipe, ring, usp, upipe-ring, fpdt, upipe-fpdt")
      ->capture_default_str();
  add_shape_options(cmd, opt->shape, true);
  cmd.add_option("--seed", opt->seed, "input seed")
      ->capture_default_str()
      ->check(integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
  cmd.add_option("--memory-budget", opt->budget, "device arena budget per rank, e.g. 80G")
      ->capture_default_str();
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
