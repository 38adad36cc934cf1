// The attention block's shape and the strategy knobs, as the user gives them.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"

namespace upipe {

struct AttentionConfig {
  int64_t seq_len = 0;        // S: global tokens
  int heads = 0;              // H
  int kv_heads = 0;           // K
  int head_dim = 0;           // d
  int64_t hidden = 0;         // D: model width (0 = H*d); Wq (H*d, D), Wo (D, H*d)
  DType dtype = DType::kF32;  // activations and compute weights
  // y, dy and dx are fp32 whatever dtype is (an fp32 residual stream the block accumulates
  // into), instead of dtype.
  bool fp32_residual = false;
  bool qk_norm = false;    // Qwen3: RMSNorm over d of every q and k head, before RoPE
  float norm_eps = 1e-6f;  // of the QK-norm
  RopeParams rope;         // theta and optional llama3 scaling
  int head_chunk = 0;      // U: query heads per UPipe stage (0 = the strategy's default)
  int ulysses_degree = 0;  // u: Ulysses group size of usp / upipe-ring (0 = all ranks)
  int chunks = 0;          // N: sequence chunks of fpdt / upipe-fpdt (0 = default)

  int64_t model_dim() const { return hidden > 0 ? hidden : q_dim(); }      // D
  int64_t q_dim() const { return int64_t(heads) * head_dim; }              // H*d
  int64_t kv_dim() const { return int64_t(kv_heads) * head_dim; }          // K*d
  int gqa_group() const { return heads / kv_heads; }                       // G = H/K
  DType out_dtype() const { return fp32_residual ? DType::kF32 : dtype; }  // of y, dy, dx
  // Throws ConfigError naming what to change when the shape itself is invalid.
  void validate_shape() const;
};

}  // namespace upipe
