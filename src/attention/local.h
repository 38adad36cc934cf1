// `local`: the whole sequence on one rank. The oracle every other strategy is compared to.
#pragma once

#include "attention/strategy.h"

namespace upipe {

class LocalAttention final : public AttentionStrategy {
 public:
  explicit LocalAttention(const StrategyContext& ctx);
  SeqLayout layout() const override;
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g, float dx_beta, float dw_beta) override;
  int64_t attn_formula_bytes() const override;
  bool can_stash() const override { return true; }
  std::unique_ptr<AttentionStash> forward_stash(const Mat& x, const AttentionWeights& w,
                                                const Mat& y, float beta) override;
  void backward_stashed(std::unique_ptr<AttentionStash> kept, const Mat& x, const Mat& dy,
                        const AttentionWeights& w, const Mat& dx, const AttentionGrads& g,
                        float dx_beta, float dw_beta) override;
  StashedAttentionBytes stash_formula_bytes() const override;
  std::optional<CommStats> comm_expected() const override { return CommStats{}; }
};

// Peak attention-intermediate bytes of `local` (docs/memory.md), a pure function of cfg.
int64_t local_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg);
// The same for the keeping variant (forward_stash / backward_stashed).
StashedAttentionBytes local_kept_bytes(const Backend& be, const AttentionConfig& cfg);

}  // namespace upipe
