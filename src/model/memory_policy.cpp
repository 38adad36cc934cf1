#include "model/memory_policy.h"

#include <fmt/format.h>

#include "core/errors.h"

namespace upipe {

Recompute parse_recompute(const std::string& s) {
  if (s == "layer") return Recompute::kLayer;
  if (s == "block") return Recompute::kBlock;
  if (s == "none") return Recompute::kNone;
  throw ConfigError(fmt::format("{}: unknown value '{}'; choose layer, block or none",
                                setting_ref("memory.recompute"), s));
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kBlock:
      return "block";
    case Recompute::kNone:
      return "none";
    default:
      return "layer";
  }
}

void MemoryPolicy::validate() const {
  if (tile_tokens < 1 || tile_tokens > kMaxTileTokens)
    throw ConfigError(fmt::format("{} must be in [1, 2^30] (got {})",
                                  setting_ref("memory.tile_tokens"), tile_tokens));
  if (residual_dtype != DType::kF32 && residual_dtype != dtype)
    throw ConfigError(
        fmt::format("{} needs {} (the residual stream is fp32 or the compute dtype)",
                    setting_value("memory.residual_dtype", dtype_name(residual_dtype)),
                    setting_value("memory.dtype", dtype_name(residual_dtype))));
}

}  // namespace upipe
