#include "attention/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/checked.h"
#include "core/errors.h"

namespace upipe {

void AttentionConfig::validate_shape() const {
  if (seq_len <= 0) throw ConfigError(fmt::format("--seq-len must be positive (got {})", seq_len));
  if (heads <= 0 || heads > kMaxHeads)
    throw ConfigError(fmt::format("--heads must be in [1, {}] (got {})", kMaxHeads, heads));
  if (kv_heads <= 0 || kv_heads > heads)
    throw ConfigError(
        fmt::format("--kv-heads must be in [1, heads ({})] (got {})", heads, kv_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim)
    throw ConfigError(
        fmt::format("--head-dim must be even and in [2, {}] (got {})", kMaxHeadDim, head_dim));
  if (hidden < 0 || hidden > kMaxHiddenSize)
    throw ConfigError(
        fmt::format("--hidden-size must be in [1, {}] (got {})", kMaxHiddenSize, hidden));
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
    int suggest = kv_heads;
    while (heads % suggest != 0) --suggest;
    throw ConfigError(
        fmt::format("heads ({}) must be divisible by kv-heads ({}); try --kv-heads {}", heads,
                    kv_heads, suggest));
  }
  // The largest tensor of every strategy (and of the checker's fp64 oracle) is a small multiple
  // of S x H x d elements; bounding it keeps every byte count and suggestion far from overflow.
  int64_t elems = 0;
  if (!mul_fits(elems, {seq_len, heads, head_dim}) || elems > kMaxTensorElements)
    throw ConfigError(fmt::format(
        "seq-len x heads x head-dim ({} x {} x {}) exceeds 2^{} elements, the largest tensor "
        "upipe sizes; try --seq-len {} or less",
        seq_len, heads, head_dim, kMaxTensorElementsLog2,
        kMaxTensorElements / (int64_t(heads) * head_dim)));
  if (!mul_fits(elems, {seq_len, model_dim()}) || elems > kMaxTensorElements)
    throw ConfigError(fmt::format(
        "seq-len x hidden-size ({} x {}) exceeds 2^{} elements, the largest tensor upipe sizes; "
        "try --seq-len {} or less",
        seq_len, model_dim(), kMaxTensorElementsLog2, kMaxTensorElements / model_dim()));
  if (!std::isfinite(rope.theta) || rope.theta < kMinRopeTheta || rope.theta > kMaxRopeTheta)
    throw ConfigError(fmt::format("--rope-theta must be a finite number in [{}, {:g}] (got {})",
                                  kMinRopeTheta, kMaxRopeTheta, rope.theta));
  if (head_chunk < 0 || head_chunk > heads)
    throw ConfigError(
        fmt::format("--head-chunk must be in [0, heads ({})], 0 meaning one head per rank (got {})",
                    heads, head_chunk));
  if (ulysses_degree < 0)
    throw ConfigError(fmt::format(
        "--ulysses-degree must be a positive divisor of the number of ranks, or 0 for all ranks "
        "(got {})",
        ulysses_degree));
  if (chunks < 0 || chunks > seq_len)
    throw ConfigError(fmt::format(
        "--chunks must be in [0, seq-len ({})], 0 meaning the default (got {})", seq_len, chunks));
}

}  // namespace upipe
