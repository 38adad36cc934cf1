// `upipe plan`: the device and host memory of one whole training step of a model on N ranks, for
// one or every method, planned on the meta device (src/plan/planner.h, docs/planner.md): at a
// given --seq-len, or the longest S that fits (--max-seq-len). One process does it all; under
// mpirun rank 0 plans and prints, the others exit 0.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/report.h"
#include "core/errors.h"
#include "plan/planner.h"

namespace upipe::app {
namespace {

const std::vector<std::string> kMethods = {"ulysses",    "upipe", "ring",      "usp",
                                           "upipe-ring", "fpdt",  "upipe-fpdt"};

struct Options {
  std::string model;
  int ranks = 0, cp_size = 0;
  double device_gib = 0, host_gib = 256, reserve_gib = double(kDefaultReserveBytes) / (1 << 30);
  std::string method = "all";
  std::string head_chunk = "auto", chunks = "auto", ulysses_degree = "auto";
  int64_t seq_len = 0;
  bool max_seq_len = false;
  std::string dtype = "bf16";
  int64_t tile_tokens = 1024;
  bool offload_checkpoints = false;
  std::string checkpoint_dtype = "fp32";
  std::string residual_dtype = "fp32";
  std::string checkpoint_granularity = "layer";
  bool json = false;
};

int64_t gib_bytes(double gib, const char* flag) {
  if (!(gib > 0) || gib > 1048576)
    throw ConfigError(
        fmt::format("{} must be a number of GiB in (0, 1048576] (got {})", flag, gib));
  return int64_t(gib * double(int64_t(1) << 30));
}

// "auto" or a whole number >= 1 (0 = the strategy's default is spelled by leaving it auto).
int knob(const std::string& s, const char* flag) {
  if (s == "auto") return 0;
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 1)
    throw ConfigError(fmt::format("{} must be auto or a positive integer (got '{}')", flag, s));
  return v;
}

double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}

std::string knobs_text(const PlanRequest& r) {
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : " ") + x; };
  if (r.head_chunk > 0) add(fmt::format("U={}", r.head_chunk));
  if (r.ulysses_degree > 0) add(fmt::format("u={}", r.ulysses_degree));
  if (r.chunks > 0) add(fmt::format("N={}", r.chunks));
  return s.empty() ? "-" : s;
}

nlohmann::json tags_json(const TagBytes& b) {
  nlohmann::json j = nlohmann::json::object();
  for (int t = 0; t < kNumTags; ++t)
    if (b.v[size_t(t)] != 0) j[tag_name(Tag(t))] = b.v[size_t(t)];
  return j;
}

struct Row {
  std::string method;
  Plan plan;
  std::string refused;  // the method's own ConfigError when it cannot run this request
};

int run(Process& proc, const Options& o) {
  if (!proc.root()) return 0;
  const ModelConfig m = load_model_config(o.model);
  PlanRequest base;
  base.ranks = o.ranks;
  base.cp_size = o.cp_size;
  base.ulysses_degree = knob(o.ulysses_degree, "--ulysses-degree");
  base.head_chunk = knob(o.head_chunk, "--head-chunk");
  base.chunks = knob(o.chunks, "--chunks");
  base.dtype = parse_dtype(o.dtype);
  base.tile_tokens = o.tile_tokens;
  base.offload_checkpoints = o.offload_checkpoints;
  base.checkpoint_dtype = parse_dtype(o.checkpoint_dtype);
  base.residual_dtype = parse_dtype(o.residual_dtype);
  base.checkpoint_granularity = parse_checkpoint_granularity(o.checkpoint_granularity);
  base.device_bytes = gib_bytes(o.device_gib, "--device-gib");
  base.host_bytes = gib_bytes(o.host_gib, "--host-gib");
  base.reserve_bytes = o.reserve_gib == 0 ? 0 : gib_bytes(o.reserve_gib, "--reserve-gib");
  base.seq_len = o.seq_len;
  if (o.max_seq_len == (o.seq_len > 0))
    throw ConfigError("give exactly one of --seq-len S and --max-seq-len");
  const AutoKnobs a{o.head_chunk == "auto", o.chunks == "auto", o.ulysses_degree == "auto"};
  check_model_fits(m, base);

  std::vector<std::string> methods = kMethods;
  if (o.method != "all") methods = {o.method};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  for (const std::string& method : methods) {
    PlanRequest r = base;
    r.method = method;
    Row row;
    row.method = method;
    try {
      row.plan = o.max_seq_len ? max_seq_len(m, r, a) : plan_auto(m, r, a);
    } catch (const ConfigError& e) {
      if (methods.size() == 1) throw;
      row.refused = e.what();
    }
    rows.push_back(std::move(row));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  bool any = false, any_host = false;
  const Plan* least_host = nullptr;
  for (const Row& r : rows)
    if (r.refused.empty()) {
      any = true;
      any_host = any_host || r.plan.host_peak <= base.host_bytes;
      if (!least_host || r.plan.host_peak < least_host->host_peak) least_host = &r.plan;
    }
  if (!any)
    throw ConfigError(fmt::format("seq-len {} is not allowed by any method: {}", o.seq_len,
                                  rows.front().refused));
  if (!any_host)
    throw ConfigError(fmt::format(
        "--host-gib {} is too small for the offloaded checkpoints: every method needs at least {} "
        "of host memory per rank at S = {}; give more host memory or drop --offload-checkpoints",
        o.host_gib, format_bytes(least_host->host_peak), least_host->request.seq_len));
  if (o.max_seq_len) {
    bool fits = false;
    for (const Row& r : rows) fits = fits || (r.refused.empty() && r.plan.fits);
    if (!fits) {
      const Plan& p = rows.front().plan;
      throw ConfigError(fmt::format(
          "no method fits {} ranks of {} (reserve {}) even at S = {}: the device peak is {} "
          "(largest: {} {})",
          base.ranks, format_bytes(base.device_bytes), format_bytes(base.reserve_bytes),
          p.request.seq_len, format_bytes(p.device_peak), tag_name(p.limiting_tag),
          format_bytes(p.device_at_peak[p.limiting_tag])));
    }
  }

  const int c = base.cp_size == 0 ? base.ranks : base.cp_size;
  if (o.json) {
    nlohmann::json j = {{"model", m.source},
                        {"ranks", base.ranks},
                        {"cp_size", c},
                        {"device_gib", o.device_gib},
                        {"host_gib", o.host_gib},
                        {"reserve_gib", gib(base.reserve_bytes)},
                        {"dtype", o.dtype},
                        {"offload_checkpoints", o.offload_checkpoints},
                        {"checkpoint_dtype", o.checkpoint_dtype},
                        {"residual_dtype", o.residual_dtype},
                        {"checkpoint_granularity", o.checkpoint_granularity},
                        {"tile_tokens", o.tile_tokens},
                        {"plan_seconds", secs}};
    nlohmann::json ms = nlohmann::json::array();
    for (const Row& r : rows) {
      if (!r.refused.empty()) {
        ms.push_back({{"method", r.method}, {"fits", false}, {"error", r.refused}});
        continue;
      }
      const Plan& p = r.plan;
      ms.push_back({{"method", r.method},
                    {"knobs",
                     {{"head_chunk", p.request.head_chunk},
                      {"ulysses_degree", p.request.ulysses_degree},
                      {"chunks", p.request.chunks}}},
                    {"seq_len", p.request.seq_len},
                    {"fits", p.fits},
                    {"device_peak_bytes", p.device_peak},
                    {"host_peak_bytes", p.host_peak},
                    {"peak_by_tag", tags_json(p.device_at_peak)},
                    {"host_peak_by_tag", tags_json(p.host_at_peak)},
                    {"worst_rank", p.worst_rank},
                    {"limiting_tag", tag_name(p.limiting_tag)}});
    }
    j["methods"] = ms;
    print_json(j);
    return 0;
  }
  std::printf(
      "%s on %d ranks (CP %d x DP %d), %s, %.4g GiB device (reserve %.4g GiB) and %.4g GiB "
      "host per rank%s; one full training step planned on every rank (%.1f s)\n",
      m.source.c_str(), base.ranks, c, base.ranks / c, o.dtype.c_str(), o.device_gib,
      gib(base.reserve_bytes), o.host_gib, o.offload_checkpoints ? ", checkpoints offloaded" : "",
      secs);
  std::printf("%-11s %-12s %12s %5s %13s %11s  %s\n", "method", "knobs",
              o.max_seq_len ? "max S" : "S", "fits", "device GiB", "host GiB", "limiting tag");
  for (const Row& r : rows) {
    if (!r.refused.empty()) {
      std::printf("%-11s not allowed: %s\n", r.method.c_str(), r.refused.c_str());
      continue;
    }
    const Plan& p = r.plan;
    std::printf("%-11s %-12s %12lld %5s %13.2f %11.2f  %s (%.2f GiB)\n", r.method.c_str(),
                knobs_text(p.request).c_str(), (long long)p.request.seq_len, p.fits ? "yes" : "no",
                gib(p.device_peak), gib(p.host_peak), tag_name(p.limiting_tag),
                gib(p.device_at_peak[p.limiting_tag]));
  }
  for (const Row& r : rows) {
    if (!r.refused.empty()) continue;
    const Plan& p = r.plan;
    std::printf("\n%s at S = %lld, rank %d's device peak %s: %s\n", r.method.c_str(),
                (long long)p.request.seq_len, p.worst_rank, format_bytes(p.device_peak).c_str(),
                Arena::describe(p.device_at_peak).c_str());
    if (p.host_peak > 0)
      std::printf("  host peak %s (rank %d): %s\n", format_bytes(p.host_peak).c_str(),
                  p.worst_host_rank, Arena::describe(p.host_at_peak).c_str());
  }
  return 0;
}

}  // namespace

Runner add_plan(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--model", opt->model, "a preset (llama3-8b, qwen3-32b, ...) or a HF folder")
      ->required();
  cmd.add_option("--ranks", opt->ranks, "ranks (GPUs) of the job")
      ->required()
      ->check(integer_in<int>(1, kMaxMetaRanks));
  cmd.add_option("--cp-size", opt->cp_size, "ranks per sequence (default: all)")
      ->check(integer_in<int>(1, kMaxMetaRanks));
  cmd.add_option("--device-gib", opt->device_gib, "device memory per rank, GiB")->required();
  cmd.add_option("--host-gib", opt->host_gib, "host memory per rank, GiB (default 256)");
  cmd.add_option("--reserve-gib", opt->reserve_gib,
                 "device memory the engine does not see (CUDA context, NCCL, allocator slack); "
                 "default 2")
      ->check(number_in(0, 1048576));
  cmd.add_option("--method", opt->method, "one method, or all (default)");
  cmd.add_option("--head-chunk", opt->head_chunk, "U of upipe methods, or auto (fewest stages)");
  cmd.add_option("--ulysses-degree", opt->ulysses_degree,
                 "u of usp / upipe-ring, or auto (the largest that fits)");
  cmd.add_option("--chunks", opt->chunks, "N of fpdt methods, or auto (fewest chunks)");
  cmd.add_option("--seq-len", opt->seq_len, "plan this sequence length")
      ->check(integer_in<int64_t>(1, kMaxTensorElements));
  cmd.add_flag("--max-seq-len", opt->max_seq_len, "find the longest S that fits");
  cmd.add_option("--dtype", opt->dtype, "activation and compute dtype: bf16 (default) or fp32");
  cmd.add_option("--tile-tokens", opt->tile_tokens, "T of the tiled MLP and LM head (1024)")
      ->check(integer_in<int64_t>(1, int64_t(1) << 30));
  cmd.add_flag("--offload-checkpoints", opt->offload_checkpoints,
               "keep the layer checkpoints in host memory");
  cmd.add_option("--checkpoint-dtype", opt->checkpoint_dtype,
                 "layer checkpoints stored as fp32 (exact, default) or bf16 (half the bytes)");
  cmd.add_option("--checkpoint-granularity", opt->checkpoint_granularity,
                 "layer (default), block (twice the checkpoints) or none (block + the MLP's "
                 "products kept)");
  cmd.add_option("--residual-dtype", opt->residual_dtype,
                 "residual stream and its gradient: fp32 (default) or bf16 (with --dtype bf16)");
  cmd.add_flag("--json", opt->json, "JSON output");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
