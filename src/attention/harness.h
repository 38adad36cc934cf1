// Runs an attention-block strategy on deterministic inputs: the tensors of one rank (x, dy at
// the rank's global positions, weights, gradients, outputs), and forward + backward with
// timing and the measured peaks. Used by `upipe check`, `upipe bench attention`, the demo and
// the multi-rank tests, so they all measure the same thing.
#pragma once

#include <cstdint>

#include "attention/strategy.h"

namespace upipe {

struct BlockTensors {
  Tensor x;                         // (rows, D) cfg.dtype, tag act
  Tensor dy, y, dx;                 // (rows, D) cfg.out_dtype(), tag act
  Tensor wq, wk, wv, wo, wqn, wkn;  // weights (QK-norm ones only with cfg.qk_norm), tag params
  Tensor gq, gk, gv, go, gqn, gkn;  // fp32 weight gradients, tag grads
  AttentionWeights weights() const { return {wq, wk, wv, wo, wqn, wkn}; }
  AttentionGrads grads() const { return {gq, gk, gv, go, gqn, gkn}; }
};

// x, dy ~ N(0, 1), weights ~ N(0, 1/D) and QK-norm weights ~ 1 + N(0, 1/4), each element a pure
// function of (seed, global index), so every sharding sees the same global tensors.
BlockTensors make_block_tensors(Device& dev, const AttentionConfig& cfg, const RowPositions& rows,
                                uint64_t seed);

struct BlockRun {
  double fwd_s = 0, bwd_s = 0;
  int64_t peak_bytes = 0;       // device arena peak during forward + backward
  TagBytes peak_by_tag;         // per-tag bytes at that peak
  int64_t attn_peak_bytes = 0;  // peak of the attention-intermediate tags (docs/design.md)
  int64_t host_peak_bytes = 0;  // host arena peak during forward + backward (fpdt's K/V chunks)
};

// One forward and one backward of `s` on t, overwriting (accumulate = false) or adding to
// (true: beta = 1) y, dx and the gradients. The arenas' peaks are reset first. keep: through
// forward_stash and backward_stashed (a strategy that keeps recomputes nothing).
BlockRun run_block(AttentionStrategy& s, Device& dev, BlockTensors& t, bool accumulate = false,
                   bool keep = false);

}  // namespace upipe
