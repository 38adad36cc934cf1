// The attention block's shape and the method with its knobs, as the user gives them.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"

namespace upipe {

// Bounds on the shape inputs (validate_shape). Heads and head_dim: far beyond any model (Llama-3
// 405B has 128 heads of 128). S x H x d: 2^50 elements (4 PiB in fp32), so every byte count,
// including the checker's fp64 copies and sums of a few dozen tensors, stays well inside int64.
// RoPE theta: real models use 1e4 to 1e8; below 1 the frequencies grow instead of decaying.
inline constexpr int kMaxHeads = 65536;
inline constexpr int kMaxHeadDim = 1024;
inline constexpr int64_t kMaxHiddenSize = int64_t(1) << 20;  // D: 64x Llama-3-405B's 16384
inline constexpr int kMaxTensorElementsLog2 = 50;
inline constexpr int64_t kMaxTensorElements = int64_t(1) << kMaxTensorElementsLog2;
inline constexpr double kMinRopeTheta = 1.0;
inline constexpr double kMaxRopeTheta = 1e12;
// Bounds on the method knobs: ranks of a group (and the planner's --ranks), sequence chunks.
inline constexpr int kMaxRanks = 65536;
inline constexpr int kMaxChunks = 1 << 20;
// A knob value only the planner takes: it picks the value (fewest stages that fit).
inline constexpr int kKnobAuto = -1;

// The attention method and its knobs, as the user gives them; attention/methods.h says which
// method takes which knob and what values fit a shape.
struct MethodKnobs {
  std::string method = "upipe";
  int stage_heads = 0;     // U: query heads per UPipe stage (0 = the all-to-all group size)
  int ulysses_degree = 0;  // u: ranks per Ulysses group of usp / upipe-ring (0 = all ranks)
  int chunks = 0;          // N: sequence chunks of fpdt / upipe-fpdt (0 = the default)
  // UPipe stage overlap: the next stage's projections and all-to-alls are started before this
  // stage's attention and this stage's are finished after the next one's (docs/strategies.md,
  // "Stage overlap"); the same arithmetic in the same order, two stages' buffers alive.
  bool overlap = false;
  bool operator==(const MethodKnobs&) const = default;
};

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
  MethodKnobs knobs;       // the strategy and its knobs

  int64_t model_dim() const { return hidden > 0 ? hidden : q_dim(); }      // D
  int64_t q_dim() const { return int64_t(heads) * head_dim; }              // H*d
  int64_t kv_dim() const { return int64_t(kv_heads) * head_dim; }          // K*d
  int gqa_group() const { return heads / kv_heads; }                       // G = H/K
  DType out_dtype() const { return fp32_residual ? DType::kF32 : dtype; }  // of y, dy, dx
  // Throws ConfigError naming what to change when the shape is out of its bounds (the knobs are
  // checked by validate_knobs and, against the rank count, by the strategies).
  void validate_shape() const;
};

// What to try when train.seq_len (S) is no multiple of `multiple`: the multiples on both sides,
// "--seq-len 32 or 34" (a length taken from a file, as eval's tokens, can only go down), or the
// smallest one when S is below it.
std::string seq_len_choices(int64_t seq_len, int64_t multiple);

}  // namespace upipe
