// `ring`: ring attention with zigzag sharding. The sequence stays sharded (rank r holds chunks r
// and 2C-1-r of 2C, which balances causal work); each rank projects its q, k, v (RoPE at global
// positions) and the K/V blocks travel around the ring (ring_pass.h), double-buffered, merging
// by online softmax; the o-projection is local. Backward recomputes the forward (its K/V make
// one more hop so each rank ends with its own block), then rotates K/V with their dK/dV
// accumulators so the gradients arrive home; dq stays local. With packed documents the ranks hold
// the documents' placement (layout.h, place_documents) and every forward or backward builds the
// mask of all members' rows once (tag docs). docs/strategies-ring.md has the memory formula and
// the communication volume, docs/documents.md the placement rule.
#pragma once

#include "attention/ring_pass.h"
#include "attention/strategy.h"

namespace upipe {

class RingAttention final : public AttentionStrategy {
 public:
  // Ring attention, and usp with Ulysses degree 1.
  explicit RingAttention(const StrategyContext& ctx);
  SeqLayout layout() const override { return layout_; }
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
  void accumulate(const Mat& q, KvRing& kv, bool come_home, const DocMask* mask, Tensor& acc,
                  Tensor& m, Tensor& l);
  void documents_changed() override;
  // The mask of every member's rows (packed documents only).
  DocMask build_mask() const;

  SeqLayout layout_;       // zigzag, or the documents' placement
  RowPositions pos_;       // global positions of this rank's rows
  RowPositions rope_pos_;  // their RoPE positions
};

// Per-rank peak of the attention intermediates (docs/strategies-ring.md) on C ranks, with the
// mask of the documents' placement when docs is given (null: one document).
int64_t ring_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg, int ranks,
                             const Documents* docs = nullptr);
// The global rows of every ring member under `layout` (the views of a ring's mask).
std::vector<RowPositions> member_rows(const SeqLayout& layout);
// The point-to-point calls and bytes this rank sends in one forward + backward.
CommStats ring_comm_expected(const AttentionConfig& cfg, int ranks);

}  // namespace upipe
