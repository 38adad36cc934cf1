#include "attention/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/errors.h"

namespace upipe {

void AttentionConfig::validate_shape() const {
  if (seq_len <= 0) throw ConfigError(fmt::format("--seq-len must be positive (got {})", seq_len));
  if (heads <= 0) throw ConfigError(fmt::format("--heads must be positive (got {})", heads));
  if (kv_heads <= 0)
    throw ConfigError(fmt::format("--kv-heads must be positive (got {})", kv_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    throw ConfigError(fmt::format("--head-dim must be even and in [2, 1024] (got {})", head_dim));
  if (hidden < 0) throw ConfigError(fmt::format("--hidden-size must be positive (got {})", hidden));
  if (!(rope.theta > 0) || !std::isfinite(rope.theta))
    throw ConfigError(
        fmt::format("--rope-theta must be a positive finite number (got {})", rope.theta));
  if (rope.scaling.enabled) {
    const RopeScaling& r = rope.scaling;
    if (!(r.factor >= 1) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) ||
        !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor) ||
        r.original_max_position <= 0)
      throw ConfigError(fmt::format(
          "--rope-scaling llama3:{}:{}:{}:{} is invalid: need FACTOR >= 1, 0 < LOW < HIGH and "
          "ORIG > 0, e.g. llama3:8:1:4:8192",
          r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position));
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps))
    throw ConfigError(
        fmt::format("the norm epsilon must be positive and finite (got {})", norm_eps));
  if (heads % kv_heads != 0) {
    int suggest = std::min(kv_heads, heads);
    while (heads % suggest != 0) --suggest;
    throw ConfigError(
        fmt::format("heads ({}) must be divisible by kv-heads ({}); try --kv-heads {}", heads,
                    kv_heads, suggest));
  }
}

}  // namespace upipe
