// The arithmetic a device executes, counted where the ops are issued (the front ends of gemm.h and
// attention.h), so a benchmark can say how close a whole step runs to the machine's GEMM rate
// (hardware FLOPs utilisation) beside the model FLOPs of MFU (train/flops.h), which leave out the
// recompute and the strategies' extra passes. The meta device counts the same as a real one.
//
// Conventions (those of bench kernel and docs/kernels.md): a GEMM (m, n, k) is 2 m n k FLOPs; an
// attention call is, per query head and per visible (query, key) pair, 4 d FLOPs forward (QK^T and
// PV) and 10 d backward (the flash backward recomputes QK^T, then dV, dP, dQ, dK). Visible pairs
// follow the call's positions exactly (causal or not), not the kernel's tiles. A call with document
// masks is not counted (its spans live in device memory); it is counted in attention_uncounted.
#pragma once

#include <cstdint>

namespace upipe {

struct WorkCount {
  double gemm_flops = 0;
  double attention_flops = 0;       // forward and backward calls
  int64_t attention_uncounted = 0;  // calls with document masks, in neither figure

  double flops() const { return gemm_flops + attention_flops; }
};

inline constexpr int kAttentionForwardFlopsPerPairDim = 4;
inline constexpr int kAttentionBackwardFlopsPerPairDim = 10;

// The (query, key) pairs a call attends: all sq * sk without the causal mask; with it, key row j
// is visible to query row i when k_pos0 + j <= q_pos0 + i (attention.h).
int64_t visible_pairs(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, bool causal);

}  // namespace upipe
