// Headwise-chunked Ulysses: UPipe(U), and Ulysses as its U = H case.
//
// Each stage projects only its query heads (rows of Wq) straight into the all-to-all layout,
// sends them head-sharded, runs attention against the resident KV set, sends the output back
// and applies the stage's slice of Wo, accumulating into y: no (S/C, H, d) output buffer
// exists. The same q / o / all-to-all buffers serve every stage; a KV set crosses the network
// once and stays resident while every query head reading it is processed (upipe_schedule.h).
// Backward mirrors it stage by stage: dq returns per stage, dK/dV accumulate over the set and
// return once. docs/strategies.md has the schedule, memory formula and communication volume.
#pragma once

#include <memory>

#include "attention/head_core.h"
#include "attention/head_stage.h"
#include "attention/strategy.h"
#include "attention/upipe_schedule.h"

namespace upipe {

class HeadwiseAttention final : public AttentionStrategy {
 public:
  // head_chunk: U (H gives Ulysses). The all-to-all runs over ctx.comm.
  HeadwiseAttention(const StrategyContext& ctx, std::string name, int head_chunk);
  std::string name() const override { return name_; }
  SeqLayout layout() const override;
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g) override;
  int64_t attn_formula_bytes() const override;
  std::optional<CommStats> comm_expected() const override;
  const UpipeSchedule& schedule() const { return sch_; }

 private:
  struct Buffers;
  StageEnv env() const { return {dev(), comm(), cfg(), sch_}; }
  void attend_forward(int stage, Buffers& b);

  std::string name_;
  UpipeSchedule sch_;
  std::unique_ptr<HeadCore> core_;
  RowPositions pos_;  // global positions of this rank's rows
};

// Per-rank peak of the attention intermediates (docs/strategies.md), for C ranks of S/C rows.
int64_t headwise_attn_peak_bytes(const AttentionConfig& cfg, const UpipeSchedule& s,
                                 const HeadCore& core);

// The collective calls and bytes this rank sends in one forward + backward.
CommStats headwise_comm_expected(const AttentionConfig& cfg, const UpipeSchedule& s);

}  // namespace upipe
