// make_strategy(): validation of a method's configuration and construction.
#include <fmt/format.h>

#include "attention/local.h"
#include "attention/strategy.h"
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
  throw ConfigError(fmt::format(
      "unknown method '{}'; choose local, ulysses, upipe, ring, usp, upipe-ring, fpdt or "
      "upipe-fpdt",
      method));
}

}  // namespace upipe
