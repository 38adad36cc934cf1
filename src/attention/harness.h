// Runs an attention-block strategy on deterministic inputs: the tensors of one rank (x, dy at
// the rank's global positions, weights, gradients, outputs), and forward + backward with
// timing and the measured peaks. Used by `upipe check`, `upipe bench attention`, the demo and
// the multi-rank tests, so they all measure the same thing.
#pragma once

#include <cstdint>

#include "attention/strategy.h"

namespace upipe {

struct BlockTensors {
  Tensor x, dy, y, dx;    // (rows, D), tag act
  Tensor wq, wk, wv, wo;  // weights, tag params
  Tensor gq, gk, gv, go;  // fp32 weight gradients, tag grads
  AttentionWeights weights() const { return {wq, wk, wv, wo}; }
  AttentionGrads grads() const { return {gq, gk, gv, go}; }
};

// x, dy ~ N(0, 1) and weights ~ N(0, 1/D), each element a pure function of (seed, global
// index), so every sharding sees the same global tensors.
BlockTensors make_block_tensors(Device& dev, const AttentionConfig& cfg, const RowPositions& rows,
                                uint64_t seed);

struct BlockRun {
  double fwd_s = 0, bwd_s = 0;
  int64_t peak_bytes = 0;       // device arena peak during forward + backward
  TagBytes peak_by_tag;         // per-tag bytes at that peak
  int64_t attn_peak_bytes = 0;  // peak of the attention-intermediate tags (SPEC.md)
};

// One forward and one backward of `s` on t. The arena's peak is reset first.
BlockRun run_block(AttentionStrategy& s, Device& dev, BlockTensors& t);

}  // namespace upipe
