#include "attention/usp.h"

#include <fmt/format.h>

#include "attention/headwise.h"
#include "attention/methods.h"
#include "attention/ring.h"
#include "attention/ring_core.h"
#include "attention/upipe_schedule.h"
#include "core/errors.h"

namespace upipe {
namespace {

// The degrees u that divide C and fit the heads, e.g. "1, 2, 4".
std::string valid_degrees(const MethodInfo& m, const AttentionConfig& c, int ranks) {
  std::string s;
  for (int u : ulysses_degrees(m, c, ranks)) s += (s.empty() ? "" : ", ") + std::to_string(u);
  return s;
}

// usp with u = 1 is ring attention; otherwise u = C leaves no ring: ulysses / upipe.
bool plain_ring(const MethodInfo& m, int u) {
  return !m.takes_stage_heads && u == 1;
}
bool no_ring(const MethodInfo& m, int u, int ranks) {
  return u == ranks && !plain_ring(m, u);
}

}  // namespace

int usp_degree(const AttentionConfig& cfg, int ranks) {
  return cfg.knobs.ulysses_degree == 0 ? ranks : cfg.knobs.ulysses_degree;
}

SeqLayout usp_layout(const AttentionConfig& c, int ranks) {
  const int u = usp_degree(c, ranks);
  if (no_ring(method_info(c.knobs.method), u, ranks))
    return {LayoutKind::kContiguous, c.seq_len, ranks, 1};
  return {LayoutKind::kZigzagGrid, c.seq_len, ranks, 1, u};  // u = 1: zigzag
}

void validate_usp(const AttentionConfig& c, int ranks) {
  const MethodInfo& m = method_info(c.knobs.method);
  const int u = usp_degree(c, ranks);
  if (u < 0 || u > ranks || ranks % u != 0)
    throw ConfigError(fmt::format("{} must divide the number of ranks ({}); valid values: {}",
                                  setting_value("parallel.ulysses_degree", u), ranks,
                                  valid_degrees(m, c, ranks)));
  const SeqLayout lay = usp_layout(c, ranks);
  if (c.seq_len % lay.divisor() != 0)
    throw ConfigError(
        fmt::format("{} ({}) must be divisible by {} ({} layout of {} group{} of {} ranks); try {}",
                    setting_ref("train.seq_len"), c.seq_len, lay.divisor(), lay.name(), ranks / u,
                    ranks / u == 1 ? "" : "s", u, seq_len_choices(c.seq_len, lay.divisor())));
  // The default degree (0) is every rank: said as such, not as a value the user never typed.
  if (!ulysses_degree_fits(m, c, ranks, u))
    throw ConfigError(fmt::format(
        "{}: {}; valid degrees on {} ranks: {}",
        c.knobs.ulysses_degree == 0
            ? fmt::format("{} (all {} ranks)", setting_value("parallel.ulysses_degree", 0), ranks)
            : setting_value("parallel.ulysses_degree", u),
        c.heads % u != 0
            ? fmt::format("{} ({}) is not divisible by it", setting_ref("attention.heads"), c.heads)
            : fmt::format("{} ({}) and it do not divide one another (each Ulysses rank holds "
                          "whole K/V heads, or one K/V head whole)",
                          setting_ref("attention.kv_heads"), c.kv_heads),
        ranks, valid_degrees(m, c, ranks)));
  if (plain_ring(m, u)) return;
  make_upipe_schedule(c, u, m.takes_stage_heads ? c.knobs.stage_heads : c.heads);  // checks U
}

std::unique_ptr<AttentionStrategy> make_usp(const StrategyContext& ctx) {
  const AttentionConfig& c = ctx.cfg;
  const MethodInfo& m = method_info(c.knobs.method);
  const int ranks = ctx.comm.size();
  validate_usp(c, ranks);
  const int u = usp_degree(c, ranks);
  const int stage_heads = m.takes_stage_heads ? c.knobs.stage_heads : c.heads;
  if (plain_ring(m, u)) return std::make_unique<RingAttention>(ctx);
  if (no_ring(m, u, ranks)) return std::make_unique<HeadwiseAttention>(ctx, stage_heads, 1);
  // Group g = rank / u holds member j = rank % u; the ring joins the members j of all groups.
  auto group = ctx.comm.split([u](int q) { return SplitKey{q / u, q % u}; });
  auto ring = ctx.comm.split([u](int q) { return SplitKey{q % u, q / u}; });
  auto core = std::make_unique<RingCore>(ctx.dev, std::move(ring), c.seq_len, c.head_dim, c.dtype);
  return std::make_unique<HeadwiseAttention>(
      ctx, stage_heads, UlyssesGroup{std::move(group), std::move(core), usp_layout(c, ranks)});
}

}  // namespace upipe
