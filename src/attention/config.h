// The attention block's shape and the strategy knobs, as the user gives them.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"

namespace upipe {

struct AttentionConfig {
  int64_t seq_len = 0;  // S: global tokens
  int heads = 0;        // H
  int kv_heads = 0;     // K
  int head_dim = 0;     // d
  DType dtype = DType::kF32;
  RopeParams rope;         // theta and optional llama3 scaling
  int head_chunk = 0;      // U: query heads per UPipe stage (0 = the strategy's default)
  int ulysses_degree = 0;  // u: Ulysses group size of usp / upipe-ring (0 = all ranks)
  int chunks = 0;          // N: sequence chunks of fpdt / upipe-fpdt (0 = default)

  int64_t model_dim() const { return int64_t(heads) * head_dim; }  // D = H*d
  int group() const { return heads / kv_heads; }                   // G = H/K
  // Throws ConfigError naming what to change when the shape itself is invalid.
  void validate_shape() const;
};

}  // namespace upipe
