#include "attention/config.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/errors.h"

namespace upipe {

void AttentionConfig::validate_shape() const {
  if (seq_len <= 0) throw ConfigError(fmt::format("--seq-len must be positive (got {})", seq_len));
  if (heads <= 0) throw ConfigError(fmt::format("--heads must be positive (got {})", heads));
  if (kv_heads <= 0)
    throw ConfigError(fmt::format("--kv-heads must be positive (got {})", kv_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    throw ConfigError(fmt::format("--head-dim must be even and in [2, 1024] (got {})", head_dim));
  if (heads % kv_heads != 0) {
    int suggest = std::min(kv_heads, heads);
    while (heads % suggest != 0) --suggest;
    throw ConfigError(
        fmt::format("heads ({}) must be divisible by kv-heads ({}); try --kv-heads {}", heads,
                    kv_heads, suggest));
  }
}

}  // namespace upipe
