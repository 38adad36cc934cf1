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

namespace upipe {

constexpr int64_t kAttnFwdBq = 192;  // query rows per forward tile
constexpr int64_t kAttnFwdBk = 512;  // key rows per forward tile
constexpr int64_t kAttnBwdBq = 192;  // query rows per backward tile
constexpr int64_t kAttnBwdBk = 128;  // key rows per backward tile
constexpr int64_t kAttnStripe = 6;   // query rows per register block (a stripe of a tile)
constexpr int64_t kAttnPanel = 16;   // keys per packed panel; key tiles are multiples of it
static_assert(kAttnFwdBk % kAttnPanel == 0 && kAttnBwdBk % kAttnPanel == 0);

// Forward, fp32 floats: K tile packed transposed (Bk, d) + score stripe (6, Bk) + output
// accumulator (Bq, d) + row max and sum (2 Bq); bf16 inputs add fp32 staging for the q tile
// (Bq, d) and the v tile (Bk, d).
inline int64_t attn_fwd_workspace_bytes(int64_t d, DType t) {
  int64_t f = kAttnFwdBk * d + kAttnStripe * kAttnFwdBk + kAttnFwdBq * d + 2 * kAttnFwdBq;
  if (t != DType::kF32) f += kAttnFwdBq * d + kAttnFwdBk * d;
  return f * 4;
}

// Backward, fp32 floats: K and V tiles packed transposed (2 Bk d) + P and dS tiles (2 Bq Bk);
// bf16 inputs add fp32 staging for the k tile (Bk, d) and the q and do tiles (2 Bq d).
inline int64_t attn_bwd_workspace_bytes(int64_t d, DType t) {
  int64_t f = 2 * kAttnBwdBk * d + 2 * kAttnBwdBq * kAttnBwdBk;
  if (t != DType::kF32) f += kAttnBwdBk * d + 2 * kAttnBwdBq * d;
  return f * 4;
}

}  // namespace upipe
