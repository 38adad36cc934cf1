#include "attention/methods.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "attention/headwise.h"
#include "attention/local.h"
#include "attention/ring.h"
#include "attention/usp.h"
#include "core/errors.h"

namespace upipe {
namespace {

void need_divisible(const AttentionConfig& c, int64_t by, const char* why) {
  // The suggestions are even too: the copy task (two equal halves) takes them as well. Both
  // neighbours: a length from a file (eval's tokens) can only go down.
  if (c.seq_len % by != 0)
    throw ConfigError(fmt::format("{} ({}) must be divisible by {} ({}); try {}",
                                  setting_ref("train.seq_len"), c.seq_len, by, why,
                                  seq_len_choices(c.seq_len, std::lcm(by, int64_t(2)))));
}

std::unique_ptr<AttentionStrategy> make_local(const StrategyContext& ctx) {
  if (ctx.comm.size() != 1)
    throw ConfigError(fmt::format(
        "method 'local' runs a sequence on one rank, but {} ranks share each sequence here; "
        "choose a context-parallel method, or run with -np 1, or (upipe train) give every rank "
        "sequences of its own with {}",
        ctx.comm.size(), setting_value("parallel.cp_size", "1")));
  return std::make_unique<LocalAttention>(ctx);
}

// Ulysses, UPipe, FPDT and UPipe+FPDT: the headwise engine with U = H or the knob, N = 1 or the
// knob. The fpdt methods check S against N C themselves (fpdt_chunks), after the head schedule.
std::unique_ptr<AttentionStrategy> make_headwise(const StrategyContext& ctx) {
  const AttentionConfig& c = ctx.cfg;
  const MethodInfo& m = method_info(c.knobs.method);
  const int ranks = ctx.comm.size();
  const int u = m.takes_stage_heads ? c.knobs.stage_heads : c.heads;
  // The heads first: a length that divides is no help where the heads cannot split (3 ranks
  // suggested S = 1002, refused next for the heads).
  make_upipe_schedule(c, ranks, u);
  if (!m.takes_chunks) {
    need_divisible(c, ranks, "the number of ranks");
    return std::make_unique<HeadwiseAttention>(ctx, u, 1);
  }
  return std::make_unique<HeadwiseAttention>(ctx, u, fpdt_chunks(c, ranks));
}

std::unique_ptr<AttentionStrategy> make_ring(const StrategyContext& ctx) {
  need_divisible(ctx.cfg, 2 * int64_t(ctx.comm.size()),
                 "twice the number of ranks: zigzag cuts the sequence into 2C chunks");
  return std::make_unique<RingAttention>(ctx);
}

int64_t one(const AttentionConfig&, int) {
  return 1;
}
int64_t ranks_of(const AttentionConfig&, int ranks) {
  return ranks;
}
int64_t twice_ranks(const AttentionConfig&, int ranks) {
  return 2 * int64_t(ranks);
}
int64_t chunk_ranks(const AttentionConfig& c, int ranks) {
  return int64_t(c.knobs.chunks > 0 ? c.knobs.chunks : kFpdtDefaultChunks) * ranks;
}
int64_t usp_divisor(const AttentionConfig& c, int ranks) {
  return usp_layout(c, ranks).divisor();
}

const std::vector<MethodInfo> kMethods = {
    {.name = "local",
     .summary = "one rank, whole sequence: the oracle",
     .one_rank = true,
     .seq_divisor = one,
     .make = make_local},
    {.name = "ulysses",
     .summary = "DeepSpeed-Ulysses: all-to-all to head-sharded, attention on H/C heads",
     .all_to_all = true,
     .seq_divisor = ranks_of,
     .make = make_headwise},
    {.name = "upipe",
     .summary = "UPipe: Ulysses in stages of U query heads, buffers reused, GQA KV sets resident",
     .takes_stage_heads = true,
     .takes_overlap = true,
     .all_to_all = true,
     .seq_divisor = ranks_of,
     .make = make_headwise},
    {.name = "ring",
     .summary = "ring attention, zigzag sharding, K/V rotate by send/recv",
     .seq_divisor = twice_ranks,
     .make = make_ring},
    {.name = "usp",
     .summary = "Ulysses inside groups of u ranks, ring across the C/u groups",
     .takes_ulysses_degree = true,
     .all_to_all = true,
     .seq_divisor = usp_divisor,
     .make = make_usp},
    {.name = "upipe-ring",
     .summary = "UPipe inside groups of u ranks, ring across the C/u groups",
     .takes_stage_heads = true,
     .takes_overlap = true,
     .takes_ulysses_degree = true,
     .all_to_all = true,
     .seq_divisor = usp_divisor,
     .make = make_usp},
    {.name = "fpdt",
     .summary = "Ulysses over N sequence chunks, K/V offloaded to the host arena",
     .takes_chunks = true,
     .all_to_all = true,
     .seq_divisor = chunk_ranks,
     .make = make_headwise},
    {.name = "upipe-fpdt",
     .summary = "UPipe head stages inside FPDT's N sequence chunks",
     .takes_stage_heads = true,
     .takes_overlap = true,
     .takes_chunks = true,
     .all_to_all = true,
     .seq_divisor = chunk_ranks,
     .make = make_headwise},
};

void check_knob(int v, int max, bool allow_auto, const char* key, const char* what) {
  if ((allow_auto && v == kKnobAuto) || (v >= 0 && v <= max)) return;
  if (v == kKnobAuto)
    throw ConfigError(fmt::format(
        "{} is for upipe plan, which picks the fastest value that fits; give a number (the "
        "plan prints it)",
        setting_value(key, "auto")));
  throw ConfigError(fmt::format("{} ({}) must be in [0, {}], 0 meaning {}{}", setting_ref(key), v,
                                max, what, allow_auto ? ", or auto" : ""));
}

void check_taken(int v, bool taken, const MethodInfo& m, const char* key, bool(MethodInfo::*f),
                 const char* unset = "0") {
  if (v == 0 || taken) return;
  std::string takers;
  for (const MethodInfo& r : kMethods)
    if (r.*f) takers += (takers.empty() ? "" : ", ") + std::string(r.name);
  throw ConfigError(fmt::format("{} is a knob of {}; method '{}' does not take it (leave it {})",
                                setting_ref(key), takers, m.name, unset));
}

}  // namespace

const std::vector<MethodInfo>& methods() {
  return kMethods;
}

const MethodInfo& method_info(std::string_view name) {
  for (const MethodInfo& m : kMethods)
    if (m.name == name) return m;
  throw ConfigError(fmt::format("{}: unknown method '{}'; choose {}",
                                setting_ref("parallel.method"), name, method_names()));
}

std::string method_names() {
  std::string s;
  for (size_t i = 0; i < kMethods.size(); ++i)
    s += (i == 0 ? "" : i + 1 == kMethods.size() ? " or " : ", ") + std::string(kMethods[i].name);
  return s;
}

bool names_many_methods(std::string_view method) {
  return method == kAllMethods || method.find(',') != std::string_view::npos;
}

std::vector<std::string> planned_methods(std::string_view method, int cp) {
  std::vector<std::string> names;
  if (method == kAllMethods) {
    for (const MethodInfo& mi : kMethods)
      if (!mi.one_rank || cp == 1) names.emplace_back(mi.name);
    return names;
  }
  for (size_t i = 0; i <= method.size();) {
    const size_t e = std::min(method.find(',', i), method.size());
    const std::string_view name = method.substr(i, e - i);
    const std::string known(method_info(name).name);  // unknown: named with the methods
    if (std::find(names.begin(), names.end(), known) != names.end())
      throw ConfigError(
          fmt::format("{}: '{}' is named twice", setting_ref("parallel.method"), known));
    names.push_back(known);
    i = e + 1;
  }
  return names;
}

void validate_knobs(const MethodKnobs& k, bool allow_auto) {
  const MethodInfo& m = method_info(k.method);
  check_knob(k.stage_heads, kMaxHeads, allow_auto, "parallel.stage_heads",
             "one head per rank per stage");
  check_knob(k.ulysses_degree, kMaxRanks, allow_auto, "parallel.ulysses_degree", "all ranks");
  check_knob(k.chunks, kMaxChunks, allow_auto, "parallel.chunks", "the default");
  check_taken(k.stage_heads, m.takes_stage_heads, m, "parallel.stage_heads",
              &MethodInfo::takes_stage_heads);
  check_taken(k.ulysses_degree, m.takes_ulysses_degree, m, "parallel.ulysses_degree",
              &MethodInfo::takes_ulysses_degree);
  check_taken(k.chunks, m.takes_chunks, m, "parallel.chunks", &MethodInfo::takes_chunks);
  check_taken(k.overlap ? 1 : 0, m.takes_overlap, m, "parallel.overlap", &MethodInfo::takes_overlap,
              "false");
}

MethodKnobs knobs_for(const MethodKnobs& k, const MethodInfo& m) {
  MethodKnobs out = k;
  out.method = std::string(m.name);
  if (!m.takes_stage_heads) out.stage_heads = 0;
  if (!m.takes_ulysses_degree) out.ulysses_degree = 0;
  if (!m.takes_chunks) out.chunks = 0;
  if (!m.takes_overlap) out.overlap = false;
  return out;
}

bool ulysses_degree_fits(const MethodInfo& m, const AttentionConfig& c, int ranks, int u) {
  if (u < 1 || ranks % u != 0) return false;
  if (u == 1 && !m.takes_stage_heads) return true;  // usp with u = 1: plain ring, any heads
  return c.heads % u == 0 && (c.kv_heads % u == 0 || u % c.kv_heads == 0);
}

std::vector<int> ulysses_degrees(const MethodInfo& m, const AttentionConfig& c, int ranks) {
  std::vector<int> out;
  for (int u = 1; u <= ranks; ++u)
    if (ulysses_degree_fits(m, c, ranks, u)) out.push_back(u);
  return out;
}

int stage_group(const MethodInfo& m, const MethodKnobs& k, int ranks) {
  return m.takes_ulysses_degree && k.ulysses_degree > 0 ? k.ulysses_degree : ranks;
}

int all_to_all_hosts(const MethodInfo& m, const MethodKnobs& k, int cp,
                     const std::vector<int>& host_of) {
  const int world = int(host_of.size());
  if (!m.all_to_all || cp < 1 || world % cp != 0) return 0;
  const int g = stage_group(m, k, cp);
  if (g < 1 || cp % g != 0) return 0;
  int most = 1;
  for (int first = 0; first < world; first += g) {
    std::vector<int> hosts(host_of.begin() + first, host_of.begin() + first + g);
    std::sort(hosts.begin(), hosts.end());
    most = std::max(most, int(std::unique(hosts.begin(), hosts.end()) - hosts.begin()));
  }
  return most;
}

std::string across_hosts_note(const AttentionConfig& cfg, int cp, const std::vector<int>& host_of) {
  const MethodInfo& info = method_info(cfg.knobs.method);
  const int n = all_to_all_hosts(info, cfg.knobs, cp, host_of);
  if (n <= 1) return "";
  std::string within;
  for (const char* name : {"upipe-ring", "usp"}) {
    const MethodInfo& other = method_info(name);
    MethodKnobs k;
    k.method = name;
    for (int u : ulysses_degrees(other, cfg, cp)) {
      k.ulysses_degree = u;
      if (u > 1 && all_to_all_hosts(other, k, cp, host_of) == 1)
        within =
            fmt::format("; {} {} keeps them within a host", setting_value("parallel.method", name),
                        setting_value("parallel.ulysses_degree", u));
    }
    if (!within.empty()) break;
  }
  return fmt::format(
      "{}'s all-to-alls span {} hosts ({} ranks a group): every layer's all-to-alls cross the "
      "network{}",
      info.name, n, stage_group(info, cfg.knobs, cp), within);
}

std::vector<int> hosts_in_order(int ranks, int per_host) {
  std::vector<int> out(size_t(std::max(ranks, 0)));
  for (int r = 0; r < ranks; ++r) out[size_t(r)] = per_host > 0 ? r / per_host : 0;
  return out;
}

std::vector<int> stage_head_choices(const AttentionConfig& c, int group) {
  std::vector<int> out;
  for (int u = c.heads; u >= group && group > 0; --u)
    if (u % group == 0 && c.heads % u == 0) out.push_back(u);
  return out;
}

std::vector<int> chunk_choices() {
  return {1, 2, 4, 8, 16, 32};
}

int effective_stage_heads(const MethodInfo& m, const AttentionConfig& c, int ranks) {
  if (!m.takes_stage_heads) return c.heads;
  return c.knobs.stage_heads > 0 ? c.knobs.stage_heads : stage_group(m, c.knobs, ranks);
}

MethodKnobs resolved_knobs(const AttentionConfig& c, int ranks) {
  const MethodInfo& mi = method_info(c.knobs.method);
  MethodKnobs k = c.knobs;
  k.stage_heads = mi.takes_stage_heads ? effective_stage_heads(mi, c, ranks) : 0;
  k.ulysses_degree = mi.takes_ulysses_degree ? stage_group(mi, c.knobs, ranks) : 0;
  k.chunks = 0;
  if (mi.takes_chunks) {
    try {
      k.chunks = fpdt_chunks(c, ranks);
    } catch (const ConfigError&) {
      k.chunks = c.knobs.chunks;
    }
  }
  return k;
}

std::string knobs_text(const AttentionConfig& c, int ranks) {
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : " ") + x; };
  const MethodInfo& mi = method_info(c.knobs.method);
  const MethodKnobs k = resolved_knobs(c, ranks);
  if (mi.takes_stage_heads) add(fmt::format("U={}", k.stage_heads));
  if (c.knobs.ulysses_degree > 0) add(fmt::format("u={}", k.ulysses_degree));
  if (k.chunks > 0) add(fmt::format("N={}", k.chunks));
  if (k.overlap) add("overlap");
  return s.empty() ? "-" : s;
}

int64_t stages_per_layer(const MethodInfo& m, const AttentionConfig& c, int ranks) {
  const int u = std::max(1, effective_stage_heads(m, c, ranks));
  const int n = m.takes_chunks ? (c.knobs.chunks > 0 ? c.knobs.chunks : kFpdtDefaultChunks) : 1;
  return int64_t(c.heads / u) * n;
}

std::unique_ptr<AttentionStrategy> make_strategy(const StrategyContext& ctx) {
  ctx.cfg.validate_shape();
  validate_knobs(ctx.cfg.knobs);
  return method_info(ctx.cfg.knobs.method).make(ctx);
}

}  // namespace upipe
