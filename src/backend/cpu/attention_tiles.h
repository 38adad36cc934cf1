// Tile sizes of the CPU flash-attention kernels and the workspace they need: pure functions,
// so the planner and the memory formulas use exactly what the kernels allocate.
//
// Tiles are fixed (not shape-dependent) and anchored at row 0 of the query and key views.
// That is the reduction-order contract: for a given query row and head, the kernel visits
// key tiles [0, kBk), [kBk, 2 kBk), ... of the key view in order, whatever other heads or rows
// the call contains. A call on a subset of heads (Ulysses, UPipe) therefore gives bitwise the
// results of a call on all heads, as long as the query and key views start at the same rows.
// docs/kernels.md states the full contract.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace upipe::cpu {

constexpr int64_t kAttnFwdBq = 768;  // query rows per forward tile
constexpr int64_t kAttnFwdBk = 512;  // key rows per forward tile
constexpr int64_t kAttnBwdBq = 96;   // query rows per backward tile
constexpr int64_t kAttnBwdBk = 256;  // key rows per backward tile
constexpr int64_t kAttnStripe = 12;  // query rows computed together (a stripe of a tile)
constexpr int64_t kAttnPanel = 16;   // keys per packed panel; key tiles are multiples of it
static_assert(kAttnFwdBk % kAttnPanel == 0 && kAttnBwdBk % kAttnPanel == 0);
// Row strides of the score tiles (floats): one panel of padding, so that a tile's rows, read
// down a column, do not all fall into the same few L1 cache sets.
constexpr int64_t kAttnFwdSld = kAttnFwdBk + kAttnPanel;
constexpr int64_t kAttnBwdSld = kAttnBwdBk + kAttnPanel;

// Head dimension rounded up to whole panels: the width of tiles packed in column chunks.
inline int64_t attn_padded_dim(int64_t d) {
  return (d + kAttnPanel - 1) / kAttnPanel * kAttnPanel;
}

// Forward, fp32 floats: K tile packed transposed (Bk, d) and V tile packed in column chunks
// (Bk, dp) + score stripe (stripe, Bk + 16) + q tile staged (Bq, d) + output accumulator (Bq, dp) +
// row max and sum (2 Bq); the same for bf16 inputs (tiles are converted when staged or packed).
// With bf16_dot (bf16 inputs on the AVX512-BF16 path: the tiles stay bf16) instead: K and V
// tiles in bf16 (Bk (d + dp) / 2) + score stripe + its bf16 probabilities (stripe (Bk + 16) / 2)
// + output accumulator + row max and sum. dp = attn_padded_dim(d).
inline int64_t attn_fwd_workspace_bytes(int64_t d, DType t, bool bf16_dot = false) {
  const int64_t dp = attn_padded_dim(d);
  if (bf16_dot)
    return 4 * (kAttnFwdBk * (d + dp) / 2 + kAttnStripe * kAttnFwdSld * 3 / 2 + kAttnFwdBq * dp +
                2 * kAttnFwdBq);
  const int64_t f =
      kAttnFwdBk * (d + dp) + kAttnStripe * kAttnFwdSld + kAttnFwdBq * (d + dp) + 2 * kAttnFwdBq;
  return f * 4;
}

// Backward, fp32 floats: K and V tiles packed transposed (2 Bk d), K packed in column chunks and
// the dK and dV accumulators of the tile in column chunks (3 Bk dp) + P and dS tiles
// (2 Bq (Bk + 16)) + q and do tiles packed in column chunks (2 Bq dp); bf16 inputs add fp32
// staging for the q and do tiles (2 Bq d). With bf16_dot instead: K and V tiles transposed and K
// in chunks, in bf16 (Bk (2 d + dp) / 2) + P and dS of the stripe (2 stripe (Bk + 16)) + the
// stripe's dS in bf16 (stripe (Bk + 16) / 2) + P and dS of the tile in bf16 pairs of rows (Bq Bk) +
// q and do tiles in bf16 pairs of rows (Bq dp) + the dK and dV accumulators (2 Bk dp).
inline int64_t attn_bwd_workspace_bytes(int64_t d, DType t, bool bf16_dot = false) {
  const int64_t dp = attn_padded_dim(d);
  if (bf16_dot)
    return 4 * (kAttnBwdBk * (2 * d + dp) / 2 + 2 * kAttnStripe * kAttnBwdSld +
                kAttnStripe * kAttnBwdSld / 2 + kAttnBwdBq * kAttnBwdBk + kAttnBwdBq * dp +
                2 * kAttnBwdBk * dp);
  int64_t f = kAttnBwdBk * (2 * d + 3 * dp) + 2 * kAttnBwdBq * kAttnBwdSld + 2 * kAttnBwdBq * dp;
  if (t != DType::kF32) f += 2 * kAttnBwdBq * d;
  return f * 4;
}

}  // namespace upipe::cpu
