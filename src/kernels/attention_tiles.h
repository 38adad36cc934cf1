// Tile sizes of the CPU flash-attention kernels and the workspace they need: pure functions,
// so the planner and the memory formulas use exactly what the kernels allocate.
//
// Tiles are fixed (not shape-dependent) and anchored at row 0 of the query and key views.
// That is the reduction-order contract: for a given query row and head, the kernel visits
// key tiles [0, kBk), [kBk, 2 kBk), ... of the key view in order, whatever other heads or rows
// the call contains. A call on a subset of heads (Ulysses, UPipe) therefore gives bitwise the
// results of a call on all heads, as long as the query and key views start at the same rows.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace upipe {

constexpr int64_t kAttnFwdBq = 128;  // query rows per forward tile
constexpr int64_t kAttnFwdBk = 512;  // key rows per forward tile
constexpr int64_t kAttnBwdBq = 128;  // query rows per backward tile
constexpr int64_t kAttnBwdBk = 128;  // key rows per backward tile

// Forward: score tile (Bq, Bk) + output accumulator (Bq, d) + row max and sum (2 Bq), fp32;
// bf16 inputs add fp32 staging for the q tile (Bq, d) and the k and v tiles (Bk, d).
inline int64_t attn_fwd_workspace_bytes(int64_t d, DType t) {
  int64_t f = kAttnFwdBq * kAttnFwdBk + kAttnFwdBq * d + 2 * kAttnFwdBq;
  if (t != DType::kF32) f += kAttnFwdBq * d + 2 * kAttnFwdBk * d;
  return f * 4;
}

// Backward: P and dP tiles (Bq, Bk), fp32; bf16 inputs add staging for q and do tiles (Bq, d)
// and k and v tiles (Bk, d).
inline int64_t attn_bwd_workspace_bytes(int64_t d, DType t) {
  int64_t f = 2 * kAttnBwdBq * kAttnBwdBk;
  if (t != DType::kF32) f += 2 * kAttnBwdBq * d + 2 * kAttnBwdBk * d;
  return f * 4;
}

}  // namespace upipe
