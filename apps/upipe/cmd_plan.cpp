// `upipe plan`: the device and host memory of one whole training step of a model on N ranks, for
// one or every method, planned on the meta device (src/plan/planner.h, docs/planner.md): at a
// given --seq-len, or the longest S that fits (--max-seq-len). One process does it all; under
// mpirun rank 0 plans and prints, the others exit 0.
#include <fmt/format.h>

#include <glob.h>
#include <malloc.h>
#include <algorithm>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "attention/headwise.h"
#include "attention/methods.h"
#include "core/errors.h"
#include "core/join.h"
#include "core/setting_ref.h"
#include "model/doc_lens.h"
#include "model/weights.h"
#include "plan/planner.h"
#include "plan/remedies.h"
#include "train/flops.h"
#include "train/loop.h"
#include "train/run_options.h"

namespace upipe::app {
namespace {

struct Options {
  std::string run_file;
  int ranks = 0;
  int ranks_per_host = 0;  // 0: every rank on one host
  std::string reserve = bytes_text(kDefaultReserveBytes);
  double reserve_gib = -1;  // the older spelling --reserve-gib (GiB); < 0: not given
  bool max_seq_len = false;
  std::string doc_lens;  // packed documents of every sequence (--doc-lens)
  bool json = false;
};

double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}

// The knobs a plan runs with, defaults resolved (attention/methods.h knobs_text).
AttentionConfig attention_of(const ModelConfig& m, const PlanRequest& r) {
  AttentionConfig a = to_attention_config(m);
  a.seq_len = r.decoder.seq_len;
  a.knobs = r.decoder.knobs;
  return a;
}

std::string knobs_text(const ModelConfig& m, const PlanRequest& r) {
  return upipe::knobs_text(attention_of(m, r), r.cp());
}

// What limits a plan: for the longest S, the arena one granule more exceeds; at a given S, the
// arena over its budget, or (the plan fits) the one nearer its budget. With that arena's largest
// tag at its peak.
struct Limit {
  std::string arena;  // "device" or "host"
  Tag tag = Tag::kParams;
  int64_t bytes = 0;
};

Tag largest(const TagBytes& b) {
  int best = 0;
  for (int t = 1; t < kNumTags; ++t)
    if (b.v[size_t(t)] > b.v[size_t(best)]) best = t;
  return Tag(best);
}

Limit limit_of(const Plan& p) {
  const PlanRequest& r = p.request;
  const double dev = double(p.device_peak + r.reserve_bytes) / double(r.device_bytes),
               host = double(p.host_peak) / double(r.host_bytes);
  const bool host_limits = !p.limit_arena.empty() ? p.limit_arena == "host" : host > dev;
  const TagBytes& at = host_limits ? p.host_at_peak : p.device_at_peak;
  const Tag t = largest(at);
  if (p.limit_arena == kPlannerRangeLimit || p.limit_arena == kSeqLenRangeLimit)
    return {p.limit_arena, t, at[t]};
  return {host_limits ? "host" : "device", t, at[t]};
}

// What limits the plan, in --json: the arena and its largest tag; past the longest S train takes,
// that S (no arena's tag limits it).
nlohmann::json limit_json(const Plan& p) {
  const Limit l = limit_of(p);
  if (l.arena == kSeqLenRangeLimit)
    return {{"arena", nullptr}, {"tag", nullptr}, {"bytes", nullptr}, {"seq_len_max", kMaxSeqLen}};
  return {{"arena", l.arena}, {"tag", tag_name(l.tag)}, {"bytes", l.bytes}};
}

// What the worst rank's step executes and sends (a complete plan's; none for one stopped at the
// budget): FLOPs per step (every micro-step alike: the played ones scaled), the model FLOPs MFU
// counts, and the bytes it sends per collective in the micro-steps played (at most 2).
struct StepWork {
  bool known = false;
  int rank = 0, played = 1, micro_steps = 1;
  double gemm = 0, attention = 0, model = 0;  // per rank per step
  int64_t uncounted = 0;                      // attention calls with documents, in neither
  CommStats comm;
};

StepWork step_work(const ModelConfig& m, const Plan& p) {
  StepWork w;
  if (!p.complete || size_t(p.worst_rank) >= p.ranks.size()) return w;
  const RankPlan& rp = p.ranks[size_t(p.worst_rank)];
  const PlanRequest& r = p.request;
  w.known = true;
  w.rank = rp.rank;
  w.micro_steps = r.micro_steps;
  w.played = std::min(r.micro_steps, 2);
  const double scale = double(r.micro_steps) / double(w.played);
  w.gemm = rp.work.gemm_flops * scale;
  w.attention = rp.work.attention_flops * scale;
  w.uncounted = rp.work.attention_uncounted;
  w.model = training_flops_per_sequence(m, r.decoder.seq_len) * double(r.micro_steps) *
            double(r.ranks / r.cp()) / double(r.ranks);
  w.comm = rp.comm;
  return w;
}

nlohmann::json step_work_json(const StepWork& w, double peak_flops) {
  if (!w.known) return nullptr;
  nlohmann::json j = {{"rank", w.rank},
                      {"executed_flops", w.gemm + w.attention},
                      {"gemm_flops", w.gemm},
                      {"attention_flops", w.attention},
                      {"attention_uncounted", w.uncounted},
                      {"model_flops_per_rank", w.model},
                      {"comm_micro_steps", w.played},
                      {"comm", comm_json(w.comm)},
                      {"comm_bytes", w.comm.total_bytes()}};
  if (peak_flops > 0) j["compute_seconds_at_peak"] = (w.gemm + w.attention) / peak_flops;
  return j;
}

// "  step (rank 3): executes 1.23 PFLOP (GEMM .., attention ..; the model's 1.0 PFLOP a rank),
//  sends 12.3 GiB (all_to_all 8 GiB, ...)".
void print_step_work(const StepWork& w, double peak_flops) {
  if (!w.known) return;
  auto tf = [](double f) {
    const char* units[] = {"GFLOP", "TFLOP", "PFLOP", "EFLOP"};
    int u = 0;
    for (f *= 1e-9; u < 3 && f >= 1000; ++u) f /= 1000;
    return fmt::format("{:.2f} {}", f, units[u]);
  };
  std::string sent;
  for (int op = 0; op < kNumCommOps; ++op)
    if (w.comm.bytes_sent[size_t(op)] > 0)
      sent += fmt::format("{}{} {}", sent.empty() ? "" : ", ", comm_op_name(CommOp(op)),
                          format_bytes(w.comm.bytes_sent[size_t(op)]));
  std::printf(
      "  a step on rank %d executes %s (GEMM %s, attention %s%s; the model's %s a rank, what MFU "
      "counts) and sends %s%s%s\n",
      w.rank, tf(w.gemm + w.attention).c_str(), tf(w.gemm).c_str(), tf(w.attention).c_str(),
      w.uncounted > 0 ? ", document-masked calls not counted" : "", tf(w.model).c_str(),
      format_bytes(w.comm.total_bytes()).c_str(), sent.empty() ? "" : (" (" + sent + ")").c_str(),
      w.played < w.micro_steps
          ? fmt::format(" in its first {} of {} micro-steps", w.played, w.micro_steps).c_str()
          : "");
  if (peak_flops > 0)
    std::printf(
        "  its compute alone at %s: %.3f s a step (the least it takes)\n",
        render_setting_refs(setting_value("metrics.peak_flops", fmt::format("{:g}", peak_flops)))
            .c_str(),
        (w.gemm + w.attention) / peak_flops);
}

// The `upipe train` command that runs a plan's answer: the settings given to the plan, with the
// method, knobs and S the plan chose.
std::string train_command(const Settings& set, const Options& o, const Plan& p) {
  RunConfig c = set.config;
  c.parallel.knobs = p.request.decoder.knobs;
  c.train.seq_len = p.request.decoder.seq_len;
  // With a run file: the file, and the flags for what differs from it (typed or chosen here).
  const RunConfig base = o.run_file.empty() ? RunConfig{} : read_run_file(o.run_file);
  std::string flags = to_flags(c, kScopeTrain, base);
  // With --init-from, a model left out is the folder's: the default preset, typed, is said.
  if (o.run_file.empty() && !c.model.init_from.empty() && c.model.name == base.model.name)
    flags = fmt::format("--model={}{}{}", c.model.name, flags.empty() ? "" : " ", flags);
  // Hosts given: ranks placed as planned, that many to a host in rank order.
  const std::string place = o.ranks_per_host > 0 && o.ranks_per_host < o.ranks
                                ? fmt::format(" --npernode {}", o.ranks_per_host)
                                : "";
  return fmt::format("mpirun -np {}{} upipe train{}{}{}{}", o.ranks, place,
                     o.run_file.empty() ? "" : " ", o.run_file, flags.empty() ? "" : " ", flags);
}

// How many hosts the plan's widest all-to-all group spans (methods.h all_to_all_hosts; 1 without
// --ranks-per-host).
int all_to_all_hosts(const Plan& p) {
  const PlanRequest& r = p.request;
  return all_to_all_hosts(method_info(r.decoder.knobs.method), r.decoder.knobs, r.cp(),
                          hosts_in_order(r.ranks, r.ranks_per_host));
}

// Said where the plan's all-to-alls cross the hosts --ranks-per-host makes ("" where they do not).
std::string across_hosts_note(const ModelConfig& m, const Plan& p) {
  const PlanRequest& r = p.request;
  AttentionConfig a = to_attention_config(m);
  a.knobs = r.decoder.knobs;
  return render_setting_refs(
      upipe::across_hosts_note(a, r.cp(), hosts_in_order(r.ranks, r.ranks_per_host)));
}

struct Row {
  std::string method;
  Plan plan;
  std::string refused;  // the method's own ConfigError when it cannot run this request
};

// How the plan's header names the documents of every sequence ("" for one each).
std::string documents_said(const Settings& set, const PlanRequest& base) {
  if (!base.doc_lens.empty())
    return fmt::format(", {} documents per sequence", base.doc_lens.size());
  if (base.worst_case_documents)
    return fmt::format(
        ", the data's documents ({}) planned at their most, one per token (--doc-lens plans "
        "given ones)",
        render_setting_refs(setting_value("data.documents", set.config.data.documents)));
  return "";
}

// The request the settings describe, before the method is chosen.
PlanRequest base_request(const Settings& set, const Options& o) {
  const RunConfig& c = set.config;
  if (!set.given("memory.device_memory"))
    throw ConfigError(fmt::format(
        "give the device memory per rank to plan for, e.g. {} (or device_memory in a run file's "
        "[memory]): train's default, 1T, only caps a CPU run's arena, so it plans nothing real",
        setting_value("memory.device_memory", "80G")));
  // A run file's seq_len is what --max-seq-len replaces (the printed command overrides it); a
  // --seq-len typed beside it is a contradiction.
  if (o.max_seq_len && set.given("train.seq_len") &&
      set.sources.spelled.at("train.seq_len").starts_with("-"))
    throw ConfigError(
        fmt::format("give one of {} and --max-seq-len", setting_ref("train.seq_len")));
  PlanRequest r = plan_request(c, o.ranks);
  r.ranks_per_host = o.ranks_per_host;
  r.reserve_bytes = o.reserve_gib >= 0 ? int64_t(o.reserve_gib * double(int64_t(1) << 30))
                                       : parse_bytes(o.reserve, "--reserve", /*allow_zero=*/true);
  if (!o.doc_lens.empty()) {
    if (o.max_seq_len)
      throw ConfigError(
          "--doc-lens gives the documents of one sequence length: drop --max-seq-len");
    r.doc_lens = documents_from(o.doc_lens, r.decoder.seq_len)->lengths();
    r.worst_case_documents = false;  // the documents given, not the data's at their worst
  }
  return r;
}

std::vector<Row> plan_rows(const ModelConfig& m, const PlanRequest& base, const Options& o) {
  const std::vector<std::string> names = planned_methods(base.decoder.knobs.method, base.cp());
  std::vector<Row> rows;
  for (const std::string& name : names) {
    PlanRequest r = base;
    r.decoder.knobs = knobs_for(base.decoder.knobs, method_info(name));
    Row row;
    row.method = name;
    try {
      row.plan = o.max_seq_len ? max_seq_len(m, r) : plan_auto(m, r);
    } catch (const ConfigError& e) {
      if (names.size() == 1) throw;
      row.refused = e.what();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Whether a data path (a file, a directory, a glob, a Megatron prefix) names something here.
bool data_here(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const bool any = ::glob(path.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
    ::globfree(&g);
    return any;
  }
  return fs::exists(path, ec) || fs::exists(path + ".bin", ec) || fs::exists(path + ".idx", ec);
}

// A path the plan would check, not on this machine (a plan made away from the cluster's files).
void say_not_here(const char* key, const std::string& path) {
  std::fprintf(stderr, "upipe: warning: %s is not on this machine: the plan does not check it\n",
               render_setting_refs(setting_value(key, path)).c_str());
}

// The longest S that fits can be longer than the data holds: said beside the run it prints.
std::string data_note(const RunDataSize& d, int64_t s) {
  std::string note;
  if (d.tokens >= 0 && d.tokens < s)
    note =
        fmt::format("{} holds {} tokens, fewer than S = {}: train needs a {} of at most {}",
                    setting_ref("data.path"), d.tokens, s, setting_ref("train.seq_len"), d.tokens);
  if (d.val_tokens >= 0 && d.val_tokens < s)
    note += fmt::format("{}{} holds {} tokens, fewer than S = {}", note.empty() ? "" : "; ",
                        setting_ref("data.val_path"), d.val_tokens, s);
  return render_setting_refs(note);
}

int run(Process& proc, const Options& o, const SettingArgs& sa, const CLI::App& cmd) {
  const Settings set = resolve_settings(proc, sa, cmd, o.run_file);
  // Every rank checks the request alike (a bad input ends every rank the same way); rank 0 plans.
  const ModelConfig m = load_model_config(set.config.model.name);
  spell_model_fields(set, m);
  const PlanRequest base = base_request(set, o);
  // The request itself first (C dividing the ranks, the reserve below the budget, the model
  // state fitting): the data's check below takes DP = ranks / C.
  check_model_fits(m, base);
  // The --init-from folder as train checks it (the same model as the run's, weights present):
  // the plan of `--model tiny --init-from QWEN_DIR` planned tiny, a run train refuses.
  if (const std::string& init = set.config.model.init_from; !init.empty()) {
    if (data_here(init))
      check_init_weights(init, m);
    else if (proc.root())
      say_not_here("model.init_from", init);
  }
  // The run's data as train opens it (its files, indexes and held-out data; S against what they
  // hold), so the run a plan prints starts. With --max-seq-len the files alone: S is found below.
  // Data that is not on this machine (a plan made away from the cluster's file system) is said,
  // and only what needs no file is checked.
  RunConfig data_cfg = set.config;
  if (o.max_seq_len) data_cfg.train.seq_len = 2;
  RunDataSize data;
  const bool files = data_cfg.data.kind == "files";
  if (files && !data_here(data_cfg.data.path)) {
    if (proc.root()) say_not_here("data.path", data_cfg.data.path);
    check_run_data(data_cfg, m, base.ranks / base.cp(), /*open_files=*/false);
  } else {
    if (!data_cfg.data.val_path.empty() && !data_here(data_cfg.data.val_path)) {
      if (proc.root()) say_not_here("data.val_path", data_cfg.data.val_path);
      data_cfg.metrics.val_interval = 0;
    }
    data = check_run_data(data_cfg, m, base.ranks / base.cp());
  }
  if (!proc.root()) return 0;
  // The planner's host lists (a packed run's mask spans, a document per token at their worst:
  // 32 MiB a view at S = 1M) are built and freed again every layer of every rank played: from
  // the heap, reused, instead of a fresh mapping each whose pages the kernel zeroes (70% of a
  // 1M-token documents plan was page faults).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Row> rows = plan_rows(m, base, o);
  // At a given S, what makes a plan that does not fit fit. Of the longest S, what goes further:
  // for the method that goes furthest (each is a search of its own: seven of them took 24 s of
  // an 8-rank --method all instead of 6), or where none fits, for the first method one fits.
  std::vector<std::vector<Remedy>> fixes(rows.size());
  std::vector<char> searched(rows.size(), 0);  // whose fixes were looked for
  if (o.max_seq_len) {
    const Row* best = nullptr;
    for (const Row& r : rows)
      if (r.refused.empty() && r.plan.fits &&
          (!best || r.plan.request.decoder.seq_len > best->plan.request.decoder.seq_len))
        best = &r;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].refused.empty() || (best && best != &rows[i])) continue;
      fixes[i] = longer(m, set.config, base, rows[i].plan);
      searched[i] = 1;
      if (!best && !fixes[i].empty()) break;
    }
  } else {
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].refused.empty() && !rows[i].plan.fits) {
        fixes[i] = remedies(m, set.config, base, rows[i].plan);
        searched[i] = 1;
      }
  }
  // The train command that runs a remedy: the plan's settings with the remedy's.
  auto remedy_command = [&](const Remedy& f) {
    Settings with = set;
    with.config = f.config;
    return train_command(with, o, f.plan);
  };
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  bool any = false, any_host = false;
  const Plan* least_host = nullptr;
  for (const Row& r : rows)
    if (r.refused.empty()) {
      any = true;
      any_host = any_host || r.plan.host_peak <= base.host_bytes;
      if (!least_host || r.plan.host_peak < least_host->host_peak) least_host = &r.plan;
    }
  if (!any) {
    // Each method's own reason (the first one's suggestion alone could suit no other).
    std::vector<std::string> why;
    for (const Row& r : rows)
      why.push_back(rows.size() == 1 ? r.refused : r.method + ": " + r.refused);
    throw ConfigError(fmt::format("{} is not allowed by any method: {}",
                                  setting_value("train.seq_len", base.decoder.seq_len),
                                  join(why, "; ")));
  }
  // The longest S needs some S to fit the host; at a given S the table says what limits.
  // What the host arena holds: the offloaded stash, fpdt's K/V chunks; named by its largest tag.
  if (o.max_seq_len && !any_host) {
    const Tag t = largest(least_host->host_at_peak);
    throw ConfigError(fmt::format(
        "{} is too small: {} at least {} of host memory per rank at S = {} (largest: {} {}); "
        "give more host memory{}",
        setting_value("memory.host_memory", bytes_text(base.host_bytes)),
        rows.size() > 1 ? "every method needs" : rows.front().method + " needs",
        format_bytes(least_host->host_peak), least_host->request.decoder.seq_len, tag_name(t),
        format_bytes(least_host->host_at_peak[t]),
        base.decoder.memory.offload_stash
            ? fmt::format(" or drop {}", setting_ref("memory.offload_stash"))
            : ""));
  }
  if (o.max_seq_len) {
    bool fits = false;
    for (const Row& r : rows) fits = fits || (r.refused.empty() && r.plan.fits);
    if (!fits) {
      // The first method planned (a refused one has no plan to speak of).
      const Plan& p = std::find_if(rows.begin(), rows.end(), [](const Row& r) {
                        return r.refused.empty();
                      })->plan;
      // What would fit: the first method's cheapest change that does.
      std::string with;
      for (size_t i = 0; i < rows.size() && with.empty(); ++i)
        if (!fixes[i].empty())
          with = fmt::format("; {} fits with {} up to S = {} ({}{})", rows[i].method,
                             fixes[i].front().flags, fixes[i].front().plan.request.decoder.seq_len,
                             fixes[i].front().exact ? "exact: " : "", fixes[i].front().costs);
      throw ConfigError(fmt::format(
          "no method fits {} ranks of {} (reserve {}) even at S = {}: the device peak is {} "
          "(largest: {} {}){}",
          base.ranks, format_bytes(base.device_bytes), format_bytes(base.reserve_bytes),
          p.request.decoder.seq_len, format_bytes(p.device_peak), tag_name(p.largest_device_tag),
          format_bytes(p.device_at_peak[p.largest_device_tag]), with));
    }
  }

  const int c = base.cp();
  if (o.json) {
    nlohmann::json j = {{"model", m.source},
                        {"ranks", base.ranks},
                        {"cp_size", c},
                        {"device_gib", gib(base.device_bytes)},
                        {"host_gib", gib(base.host_bytes)},
                        {"reserve_gib", gib(base.reserve_bytes)},
                        {"documents", std::max<size_t>(1, base.doc_lens.size())},
                        {"documents_worst_case", base.worst_case_documents},
                        {"plan_seconds", secs}};
    j.update(memory_policy_json(base.decoder.memory));
    nlohmann::json ms = nlohmann::json::array();
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      if (!r.refused.empty()) {
        ms.push_back({{"method", r.method}, {"fits", false}, {"error", r.refused}});
        continue;
      }
      const Plan& p = r.plan;
      ms.push_back({{"method", r.method},
                    {"knobs",
                     {{"stage_heads", p.request.decoder.knobs.stage_heads},
                      {"ulysses_degree", p.request.decoder.knobs.ulysses_degree},
                      {"chunks", p.request.decoder.knobs.chunks},
                      {"overlap", p.request.decoder.knobs.overlap}}},
                    {"resolved_knobs", resolved_knobs_json(attention_of(m, p.request), c)},
                    {"knobs_text", knobs_text(m, p.request)},
                    {"seq_len", p.request.decoder.seq_len},
                    {"fits", p.fits},
                    {"device_peak_bytes", p.device_peak},
                    {"host_peak_bytes", p.host_peak},
                    {"peak_by_tag", tags_json(p.device_at_peak)},
                    {"host_peak_by_tag", tags_json(p.host_at_peak)},
                    {"worst_rank", p.worst_rank},
                    {"rank_classes", p.rank_classes},
                    // What limits S: limit's tag (the host's where the host arena limits); the
                    // device's largest tag beside it (limiting_tag was that, and said "act" for a
                    // method the host's stash limits).
                    {"limiting_tag", limit_json(p)["tag"]},
                    {"largest_device_tag", tag_name(p.largest_device_tag)},
                    {"limit", limit_json(p)},
                    {"all_to_all_hosts", all_to_all_hosts(p)},
                    {"step_work", step_work_json(step_work(m, p), set.config.metrics.peak_flops)},
                    // The command of a plan that fits; none for one that does not.
                    {"train_command",
                     p.fits ? nlohmann::json(train_command(set, o, p)) : nlohmann::json(nullptr)}});
      if (const std::string note = across_hosts_note(m, p); !note.empty())
        ms.back()["hosts_note"] = note;
      if (const std::string note = data_note(data, p.request.decoder.seq_len); !note.empty())
        ms.back()["data_note"] = note;
      // What fits at this S (fits_with), or what goes past the longest S (longer_with; for the
      // method that goes furthest).
      if (searched[i]) {
        nlohmann::json with = nlohmann::json::array();
        for (const Remedy& f : fixes[i])
          with.push_back({{"flags", f.flags},
                          {"costs", f.costs},
                          {"exact", f.exact},
                          {"knobs_text", knobs_text(m, f.plan.request)},
                          {"seq_len", f.plan.request.decoder.seq_len},
                          {"device_peak_bytes", f.plan.device_peak},
                          {"host_peak_bytes", f.plan.host_peak},
                          {"train_command", remedy_command(f)}});
        ms.back()[o.max_seq_len ? "longer_with" : "fits_with"] = with;
      }
    }
    j["methods"] = ms;
    print_json(j);
    return 0;
  }
  std::printf(
      "%s on %d rank%s (CP %d x DP %d), %s, %s device (reserve %s) and %s host per rank%s%s; one "
      "full training step planned for every rank, played once per rank class (%.1f s)\n",
      m.source.c_str(), base.ranks, base.ranks == 1 ? "" : "s", c, base.ranks / c,
      dtype_name(base.decoder.memory.dtype), format_bytes(base.device_bytes).c_str(),
      format_bytes(base.reserve_bytes).c_str(), format_bytes(base.host_bytes).c_str(),
      base.decoder.memory.offload_stash ? ", stash offloaded" : "",
      documents_said(set, base).c_str(), secs);
  // Sizes in the unit that shows them (a tiny preset's MiB would read 0.00 GiB).
  int knobs_width = 12;  // "U=2 u=2 overlap" is wider
  for (const Row& r : rows)
    if (r.refused.empty())
      knobs_width = std::max(knobs_width, int(knobs_text(m, r.plan.request).size()));
  std::printf("%-11s %-*s %12s %5s %13s %11s  %s\n", "method", knobs_width, "knobs",
              o.max_seq_len ? "max S" : "S", "fits", "device peak", "host peak",
              "limit (its largest tag)");
  for (const Row& r : rows) {
    if (!r.refused.empty()) {
      std::printf("%-11s not allowed: %s\n", r.method.c_str(), r.refused.c_str());
      continue;
    }
    const Plan& p = r.plan;
    const Limit l = limit_of(p);
    const std::string limit =
        l.arena == kSeqLenRangeLimit
            ? render_setting_refs(
                  fmt::format("the longest {} ({})", setting_ref("train.seq_len"), kMaxSeqLen))
            : fmt::format("{} ({} {})", l.arena, tag_name(l.tag), format_bytes(l.bytes));
    std::printf("%-11s %-*s %12lld %5s %13s %11s  %s\n", r.method.c_str(), knobs_width,
                knobs_text(m, p.request).c_str(), (long long)p.request.decoder.seq_len,
                p.fits ? "yes" : "no", format_bytes(p.device_peak).c_str(),
                format_bytes(p.host_peak).c_str(), limit.c_str());
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (!r.refused.empty()) continue;
    const Plan& p = r.plan;
    std::printf("\n%s at S = %lld, rank %d's device peak %s: %s\n", r.method.c_str(),
                (long long)p.request.decoder.seq_len, p.worst_rank,
                format_bytes(p.device_peak).c_str(), Arena::describe(p.device_at_peak).c_str());
    if (p.host_peak > 0)
      std::printf("  host peak %s (rank %d): %s\n", format_bytes(p.host_peak).c_str(),
                  p.worst_host_rank, Arena::describe(p.host_at_peak).c_str());
    print_step_work(step_work(m, p), set.config.metrics.peak_flops);
    if (const std::string note = across_hosts_note(m, p); !note.empty())
      std::printf("  note: %s\n", note.c_str());
    // The command of a plan that fits, and what the data or --doc-lens add to it.
    auto run_it = [&](const std::string& command) {
      std::printf("  run it: %s\n", command.c_str());
      if (const std::string note = data_note(data, p.request.decoder.seq_len); !note.empty())
        std::printf("  note: %s\n", note.c_str());
      // --doc-lens is the planner's: a run's documents come from its data.
      if (!o.doc_lens.empty())
        std::printf(
            "  (its documents come from the data: --data-kind=files --documents=eos:ID or index; "
            "--doc-lens has no train flag)\n");
    };
    // A remedy's line: its flags, knobs, peaks and costs (and S, for the longest).
    auto say = [&](const Remedy& f) {
      const std::string knobs = knobs_text(m, f.plan.request);
      std::printf(
          "    %s: %s%sdevice peak %s%s (%s%s)\n", f.flags.c_str(),
          o.max_seq_len ? fmt::format("S = {}, ", f.plan.request.decoder.seq_len).c_str() : "",
          knobs == "-" ? "" : (knobs + ", ").c_str(), format_bytes(f.plan.device_peak).c_str(),
          f.plan.host_peak > 0 ? (", host peak " + format_bytes(f.plan.host_peak)).c_str() : "",
          f.exact ? "exact: " : "", f.costs.c_str());
    };
    if (p.fits) {
      run_it(train_command(set, o, p));
      if (o.max_seq_len && !fixes[i].empty()) {
        std::printf("  longer with:\n");
        for (const Remedy& f : fixes[i]) say(f);
      }
    } else if (!o.max_seq_len) {
      const std::vector<Remedy>& fs = fixes[i];
      if (fs.empty())
        std::printf(
            "  no setting that lowers memory makes it fit at this S, alone or together (%s): "
            "--max-seq-len finds the longest S that fits; more ranks split the sequence "
            "further%s\n",
            join(remedy_step_names(), ", ").c_str(),
            rows.size() == 1 ? "; --method all plans every method" : "");
      else
        std::printf("  it fits with%s:\n", fs.size() > 1 ? " any of these" : "");
      for (const Remedy& f : fs) say(f);
      if (!fs.empty()) run_it(remedy_command(fs.front()));
    }
  }
  return 0;
}

}  // namespace

Runner add_plan(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("run_file", opt->run_file,
                 "a training run file (docs/training.md): plan exactly that run");
  cmd.add_option("--ranks", opt->ranks, "ranks (GPUs) of the job")
      ->required()
      ->check(integer_in<int>(1, kMaxRanks));
  cmd.add_option("--ranks-per-host", opt->ranks_per_host,
                 "ranks (GPUs) on each host, placed in rank order (mpirun --npernode): an auto "
                 "--ulysses-degree keeps the all-to-alls within a host, and the plan says where "
                 "they cross hosts; default: every rank on one host")
      ->check(integer_in<int>(1, kMaxRanks));
  cmd.add_option("--reserve", opt->reserve,
                 "device memory the engine does not see (CUDA context, NCCL, allocator slack)")
      ->capture_default_str();
  cmd.add_option("--reserve-gib", opt->reserve_gib, "older spelling of --reserve, in GiB")
      ->check(named(number_in(0, 1048576), "--reserve-gib"))
      ->group("");
  cmd.add_flag("--max-seq-len", opt->max_seq_len, "find the longest S that fits");
  add_doc_lens_option(
      cmd, opt->doc_lens,
      "every sequence as packed documents: lengths a,b,c summing to --seq-len, or a "
      ".npy/.bin file of them (the documents' mask, tag docs, in every rank's plan)");
  cmd.add_flag("--json", opt->json, "JSON output");
  cmd.footer(
      "--method all plans every method, a list (--method upipe,ring) those named; a knob set to "
      "auto (--stage-heads auto, --chunks auto, "
      "--ulysses-degree auto) is the fastest value that fits. Every other setting of `upipe "
      "train` is taken too (a train command's flags plan as they are) and checked as train "
      "checks it; those that do not change memory (--lr, --checkpoint-dir, ...) change nothing "
      "here.");
  // The settings train takes, validated as train does (the copy task's even S): the plan of a
  // train command's flags, and the `run it` command it prints, runs.
  auto sa = add_settings(cmd, kScopePlan, kScopeTrain);
  // plan asks for the memory it plans for: the table's default is train's (no budget).
  cmd.get_option("--device-memory")
      ->description(
          "device memory per rank to plan for, e.g. 80G (plan has no default: an H100 or H200 "
          "is not this machine)");
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
