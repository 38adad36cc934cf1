// Headwise-chunked Ulysses: UPipe(U), and Ulysses as its U = H case.
//
// Each stage projects only its query heads (rows of Wq) straight into the all-to-all layout,
// sends them head-sharded, runs attention against the resident KV set, sends the output back
// and applies the stage's slice of Wo, accumulating into y: no (S/C, H, d) output buffer
// exists. The same q / o / all-to-all buffers serve every stage; a KV set crosses the network
// once and stays resident while every query head reading it is processed (upipe_schedule.h).
// Backward mirrors it stage by stage: dq returns per stage, dK/dV accumulate over the set and
// return once. docs/strategies.md has the schedule, memory formula and communication volume.
//
// By default the all-to-all spans the whole CP group and the attention between the all-to-alls
// is local (LocalCore). USP and UPipe+ring (usp.h) give it a Ulysses group split from the CP
// group, a ring core across the groups and the zigzag grid layout instead.
#pragma once

#include <memory>

#include "attention/head_core.h"
#include "attention/head_stage.h"
#include "attention/strategy.h"
#include "attention/upipe_schedule.h"

namespace upipe {

// Where the engine's all-to-all runs and what attention runs between its all-to-alls.
struct HeadwiseGroup {
  std::unique_ptr<Communicator> comm;  // the Ulysses group of u ranks, split from the CP group
  std::unique_ptr<HeadCore> core;      // attention over the group's u S/C tokens
  SeqLayout layout;                    // rows of every rank of the CP group
};

class HeadwiseAttention final : public AttentionStrategy {
 public:
  // head_chunk: U (H gives Ulysses). The all-to-all runs over ctx.comm.
  HeadwiseAttention(const StrategyContext& ctx, std::string name, int head_chunk);
  // The same with the all-to-all inside group.comm and group.core between the all-to-alls.
  HeadwiseAttention(const StrategyContext& ctx, std::string name, int head_chunk,
                    HeadwiseGroup group);
  std::string name() const override { return name_; }
  SeqLayout layout() const override;
  void forward(const Mat& x, const AttentionWeights& w, const Mat& y, float beta) override;
  void backward(const Mat& x, const Mat& dy, const AttentionWeights& w, const Mat& dx,
                const AttentionGrads& g, float dx_beta, float dw_beta) override;
  int64_t attn_formula_bytes() const override;
  ErrorClass error_class() const override;
  std::optional<CommStats> comm_expected() const override;
  const UpipeSchedule& schedule() const { return sch_; }

 private:
  struct Buffers;
  Communicator& group() const { return *a2a_; }
  StageEnv env() const { return {dev(), group(), cfg(), sch_}; }
  void attend_forward(int stage, Buffers& b);

  std::string name_;
  std::unique_ptr<Communicator> own_group_;  // the split group, when not the CP group itself
  Communicator* a2a_;                        // where the all-to-all runs: u ranks
  SeqLayout layout_;
  UpipeSchedule sch_;
  std::unique_ptr<HeadCore> core_;
  RowPositions pos_;  // global positions of this rank's rows
};

// Per-rank peak of the attention intermediates (docs/strategies.md, docs/strategies-ring.md)
// on a CP group of `ranks` ranks of S/C rows, with all-to-all groups of s.ranks of them.
int64_t headwise_attn_peak_bytes(const Backend& be, const AttentionConfig& cfg,
                                 const UpipeSchedule& s, const HeadCore& core, int ranks);

// The collective calls and bytes this rank sends in one forward + backward (the core's
// messages included).
CommStats headwise_comm_expected(const AttentionConfig& cfg, const UpipeSchedule& s,
                                 const HeadCore& core, int ranks);

}  // namespace upipe
