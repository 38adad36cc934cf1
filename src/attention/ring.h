// `ring`: ring attention with zigzag sharding. The sequence stays sharded (rank r holds chunks r
// and 2C-1-r of 2C, which balances causal work); each rank projects its q, k, v (RoPE at global
// positions) and the K/V blocks travel around the ring (ring_pass.h), double-buffered, merging
// by online softmax; the o-projection is local. Backward recomputes the forward (its K/V make
// one more hop so each rank ends with its own block), then rotates K/V with their dK/dV
// accumulators so the gradients arrive home; dq stays local. docs/strategies-ring.md has the
// memory formula and the communication volume.
#pragma once

#include "attention/ring_pass.h"
#include "attention/strategy.h"

namespace upipe {

class RingAttention final : public AttentionStrategy {
 public:
  // Ring attention, and usp with Ulysses degree 1.
  explicit RingAttention(const StrategyContext& ctx);
  SeqLayout layout() const override;
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g, float dx_beta, float dw_beta) override;
  int64_t attn_formula_bytes() const override;
  ErrorClass error_class() const override { return ErrorClass::kMerge; }
  std::optional<CommStats> comm_expected() const override;

 private:
  // q (S/C, H*d) and the K/V ring with this rank's k, v (S/C, K*d) in its current slot, RoPE
  // applied at the rank's global positions.
  void project(const Mat& x, const AttentionWeights& w, Tensor& q, KvRing& kv);
  // The ring pass into acc (S/C, H*d) fp32, m, l (H, S/C) fp32.
  void accumulate(const Mat& q, KvRing& kv, bool come_home, Tensor& acc, Tensor& m, Tensor& l);

  RowPositions pos_;  // global positions of this rank's rows
};

// Per-rank peak of the attention intermediates (docs/strategies-ring.md) on C ranks.
int64_t ring_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg, int ranks);
// The point-to-point calls and bytes this rank sends in one forward + backward.
CommStats ring_comm_expected(const AttentionConfig& cfg, int ranks);

}  // namespace upipe
