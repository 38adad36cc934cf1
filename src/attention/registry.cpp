// make_strategy(): validation of a method's configuration and construction.
#include <fmt/format.h>

#include "attention/headwise.h"
#include "attention/local.h"
#include "attention/ring.h"
#include "attention/strategy.h"
#include "attention/usp.h"
#include "core/errors.h"

namespace upipe {

std::unique_ptr<AttentionStrategy> make_strategy(const std::string& method,
                                                 const StrategyContext& ctx) {
  ctx.cfg.validate_shape();
  const int c = ctx.comm.size();
  if (method == "local") {
    if (c != 1)
      throw ConfigError(fmt::format(
          "method 'local' runs on one rank, but {} ranks were started; run without mpirun or "
          "with -np 1",
          c));
    return std::make_unique<LocalAttention>(ctx);
  }
  auto need_divisible = [&](int64_t by, const char* why) {
    if (ctx.cfg.seq_len % by != 0)
      throw ConfigError(fmt::format("seq-len ({}) must be divisible by {} ({}); try --seq-len {}",
                                    ctx.cfg.seq_len, by, why, (ctx.cfg.seq_len / by + 1) * by));
  };
  if (method == "ulysses") {
    need_divisible(c, "the number of ranks");
    return std::make_unique<HeadwiseAttention>(ctx, "ulysses", ctx.cfg.heads, 1);
  }
  if (method == "upipe") {
    need_divisible(c, "the number of ranks");
    return std::make_unique<HeadwiseAttention>(ctx, "upipe", ctx.cfg.head_chunk, 1);
  }
  // fpdt / upipe-fpdt check S against N C themselves (fpdt_chunks), after the head schedule.
  if (method == "fpdt" || method == "upipe-fpdt") {
    make_upipe_schedule(ctx.cfg, c, method == "fpdt" ? ctx.cfg.heads : ctx.cfg.head_chunk);
    return std::make_unique<HeadwiseAttention>(
        ctx, method, method == "fpdt" ? ctx.cfg.heads : ctx.cfg.head_chunk,
        fpdt_chunks(ctx.cfg, c));
  }
  if (method == "ring") {
    need_divisible(2 * int64_t(c),
                   "twice the number of ranks: zigzag cuts the sequence into 2C chunks");
    return std::make_unique<RingAttention>(ctx);
  }
  if (method == "usp" || method == "upipe-ring") return make_usp(method, ctx);
  throw ConfigError(fmt::format(
      "unknown method '{}'; choose local, ulysses, upipe, ring, usp, upipe-ring, fpdt or "
      "upipe-fpdt",
      method));
}

}  // namespace upipe
