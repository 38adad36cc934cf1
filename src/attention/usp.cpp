#include "attention/usp.h"

#include <fmt/format.h>

#include "attention/headwise.h"
#include "attention/ring.h"
#include "attention/ring_core.h"
#include "attention/upipe_schedule.h"
#include "core/errors.h"

namespace upipe {
namespace {

bool heads_fit(const AttentionConfig& c, int u) {
  return c.heads % u == 0 && (c.kv_heads % u == 0 || u % c.kv_heads == 0);
}

// The degrees u that divide C and fit the heads, e.g. "1, 2, 4".
std::string valid_degrees(const AttentionConfig& c, int ranks) {
  std::string s;
  for (int u = 1; u <= ranks; ++u)
    if (ranks % u == 0 && heads_fit(c, u)) s += (s.empty() ? "" : ", ") + std::to_string(u);
  return s;
}

// usp with u = 1 is ring attention; otherwise u = C leaves no ring: ulysses / upipe.
bool plain_ring(const std::string& method, int u) {
  return method == "usp" && u == 1;
}
bool no_ring(const std::string& method, int u, int ranks) {
  return u == ranks && !plain_ring(method, u);
}

// The rows layout of the strategy (method, u) selects.
SeqLayout usp_layout(const std::string& method, const AttentionConfig& c, int ranks, int u) {
  if (no_ring(method, u, ranks)) return {LayoutKind::kContiguous, c.seq_len, ranks, 1};
  return {LayoutKind::kZigzagGrid, c.seq_len, ranks, 1, u};  // u = 1: zigzag
}

}  // namespace

int usp_degree(const AttentionConfig& cfg, int ranks) {
  return cfg.ulysses_degree == 0 ? ranks : cfg.ulysses_degree;
}

void validate_usp(const std::string& method, const AttentionConfig& c, int ranks) {
  const int u = usp_degree(c, ranks);
  if (u < 0 || u > ranks || ranks % u != 0)
    throw ConfigError(
        fmt::format("--ulysses-degree u={} must divide the number of ranks ({}); valid values: {}",
                    c.ulysses_degree, ranks, valid_degrees(c, ranks)));
  const SeqLayout lay = usp_layout(method, c, ranks, u);
  if (c.seq_len % lay.divisor() != 0)
    throw ConfigError(fmt::format(
        "seq-len ({}) must be divisible by {} ({} layout of {} groups of {} ranks); try "
        "--seq-len {}",
        c.seq_len, lay.divisor(), lay.name(), ranks / u, u,
        (c.seq_len / lay.divisor() + 1) * lay.divisor()));
  if (plain_ring(method, u)) return;  // any heads
  if (c.heads % u != 0)
    throw ConfigError(fmt::format(
        "heads ({}) must be divisible by --ulysses-degree ({}); valid degrees on {} ranks: {}",
        c.heads, u, ranks, valid_degrees(c, ranks)));
  if (c.kv_heads % u != 0 && u % c.kv_heads != 0)
    throw ConfigError(fmt::format(
        "kv-heads ({}) and --ulysses-degree ({}) must divide one another; valid degrees on {} "
        "ranks: {}",
        c.kv_heads, u, ranks, valid_degrees(c, ranks)));
  make_upipe_schedule(c, u, method == "usp" ? c.heads : c.head_chunk);  // checks U
}

std::unique_ptr<AttentionStrategy> make_usp(const std::string& method, const StrategyContext& ctx) {
  const AttentionConfig& c = ctx.cfg;
  const int ranks = ctx.comm.size();
  validate_usp(method, c, ranks);
  const int u = usp_degree(c, ranks);
  const int head_chunk = method == "usp" ? c.heads : c.head_chunk;
  if (plain_ring(method, u)) return std::make_unique<RingAttention>(ctx, method);
  if (no_ring(method, u, ranks))
    return std::make_unique<HeadwiseAttention>(ctx, method, head_chunk, 1);
  // Group g = rank / u holds member j = rank % u; the ring joins the members j of all groups.
  auto group = ctx.comm.split([u](int q) { return SplitKey{q / u, q % u}; });
  auto ring = ctx.comm.split([u](int q) { return SplitKey{q % u, q / u}; });
  auto core = std::make_unique<RingCore>(ctx.dev, std::move(ring), c.seq_len, c.head_dim, c.dtype);
  return std::make_unique<HeadwiseAttention>(
      ctx, method, head_chunk,
      UlyssesGroup{std::move(group), std::move(core), usp_layout(method, c, ranks, u)});
}

}  // namespace upipe
