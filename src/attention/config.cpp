#include "attention/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/checked.h"
#include "core/errors.h"

namespace upipe {

void AttentionConfig::validate_shape() const {
  if (seq_len <= 0)
    throw ConfigError(
        fmt::format("{} must be positive (got {})", setting_ref("train.seq_len"), seq_len));
  if (heads <= 0 || heads > kMaxHeads)
    throw ConfigError(fmt::format("{} must be in [1, {}] (got {})", setting_ref("attention.heads"),
                                  kMaxHeads, heads));
  if (kv_heads <= 0 || kv_heads > heads)
    throw ConfigError(fmt::format("{} must be in [1, {} ({})] (got {})",
                                  setting_ref("attention.kv_heads"), setting_ref("attention.heads"),
                                  heads, kv_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim)
    throw ConfigError(fmt::format("{} must be even and in [2, {}] (got {})",
                                  setting_ref("attention.head_dim"), kMaxHeadDim, head_dim));
  if (hidden < 0 || hidden > kMaxHiddenSize)
    throw ConfigError(fmt::format("{} must be in [1, {}] (got {})",
                                  setting_ref("attention.hidden_size"), kMaxHiddenSize, hidden));
  if (rope.scaling.enabled) {
    const RopeScaling& r = rope.scaling;
    if (!(r.factor >= 1) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) ||
        !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor) ||
        r.original_max_position <= 0)
      throw ConfigError(fmt::format(
          "{} is invalid: need FACTOR >= 1, 0 < LOW < HIGH and ORIG > 0, e.g. llama3:8:1:4:8192",
          setting_value("attention.rope_scaling",
                        fmt::format("llama3:{}:{}:{}:{}", r.factor, r.low_freq_factor,
                                    r.high_freq_factor, r.original_max_position))));
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps))
    throw ConfigError(
        fmt::format("the norm epsilon must be positive and finite (got {})", norm_eps));
  if (heads % kv_heads != 0) {
    int suggest = kv_heads;
    while (heads % suggest != 0) --suggest;
    throw ConfigError(fmt::format(
        "{} ({}) must be divisible by {} ({}); try {}", setting_ref("attention.heads"), heads,
        setting_ref("attention.kv_heads"), kv_heads, setting_value("attention.kv_heads", suggest)));
  }
  // The largest tensor of every strategy (and of the checker's fp64 oracle) is a small multiple
  // of S x H x d elements; bounding it keeps every byte count and suggestion far from overflow.
  int64_t elems = 0;
  if (!mul_fits(elems, {seq_len, heads, head_dim}) || elems > kMaxTensorElements)
    throw ConfigError(fmt::format(
        "seq-len x heads x head-dim ({} x {} x {}) exceeds 2^{} elements, the largest tensor "
        "upipe sizes; try {} or less",
        seq_len, heads, head_dim, kMaxTensorElementsLog2,
        setting_value("train.seq_len", kMaxTensorElements / (int64_t(heads) * head_dim))));
  if (!mul_fits(elems, {seq_len, model_dim()}) || elems > kMaxTensorElements)
    throw ConfigError(fmt::format(
        "seq-len x hidden-size ({} x {}) exceeds 2^{} elements, the largest tensor upipe sizes; "
        "try {} or less",
        seq_len, model_dim(), kMaxTensorElementsLog2,
        setting_value("train.seq_len", kMaxTensorElements / model_dim())));
  if (!std::isfinite(rope.theta) || rope.theta < kMinRopeTheta || rope.theta > kMaxRopeTheta)
    throw ConfigError(fmt::format("{} must be a finite number in [{}, {:g}] (got {})",
                                  setting_ref("attention.rope_theta"), kMinRopeTheta, kMaxRopeTheta,
                                  rope.theta));
}

std::string seq_len_choices(int64_t seq_len, int64_t multiple) {
  const int64_t below = seq_len / multiple * multiple;
  if (below <= 0) return setting_value("train.seq_len", multiple);
  return fmt::format("{} or {}", setting_value("train.seq_len", below), below + multiple);
}

}  // namespace upipe
