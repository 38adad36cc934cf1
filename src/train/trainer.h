// One training step over the world = DP x CP: every CP group of cp_size consecutive ranks shares
// one sequence per micro-step, the DP groups see different sequences, and ZeRO-3 (zero.h) shards
// the fp32 master weights, gradients and AdamW moments over all ranks.
//
// A step: zero the gradient shards; for each micro-step run the decoder on this DP rank's
// sequence with loss scale 1 / (tokens predicted in the global batch) (so the summed gradient is
// the batch mean whatever the DP x CP split and the micro-steps); complete the reduce-scatters;
// the global gradient norm; clip (scale the gradient by min(1, clip / (norm + 1e-6))); AdamW
// with the schedule's learning rate. A non-finite loss or gradient norm ends the run with an
// error naming the step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/decoder.h"
#include "train/zero.h"

namespace upipe {

// Linear warmup from lr / warmup to lr over `warmup` steps, then cosine decay to min_lr at
// `steps`. lr_at(t) for the step t counted from 0.
struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 0, steps = 1;
  double lr_at(int64_t t) const;
};

struct TrainOptions {
  int cp_size = 0;         // ranks per sequence (0 = all ranks)
  DecoderOptions decoder;  // method, seq_len, dtype, knobs, tile_tokens, offload
  int micro_steps = 1;     // gradient accumulation
  LrSchedule schedule;
  OptimizerSpec optimizer;
  double grad_clip = 1.0;  // 0 = no clipping
  // The data holds packed documents: each step's loss is the mean over the predictions inside
  // the documents of its global batch, counted over the DP groups first.
  bool packed = false;
};

// One sequence of S tokens and, optionally, S group flags (the copy task's copied half) and its
// documents (see LossSpec in model/decoder.h).
struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> group;
  std::shared_ptr<const Documents> documents = nullptr;  // null: one document
};
// The sequence of (step, micro-step, DP rank): must be a pure function of its arguments.
using SequenceFn = std::function<Sequence(int64_t step, int micro, int dp_rank)>;
// A sequence the caller owns, valid until the step ends (the planner's S zero ids, which it maps
// rather than stores).
struct SequenceView {
  std::span<const int32_t> tokens;
  std::span<const uint8_t> group;
  std::shared_ptr<const Documents> documents = nullptr;  // null: one document
};
using SequenceViewFn = std::function<SequenceView(int64_t step, int micro, int dp_rank)>;

struct StepResult {
  double loss = 0;        // the batch mean token loss
  double group_loss = 0;  // the mean over the group's predictions (NaN-free; 0 without a group)
  double grad_norm = 0;   // before clipping
  double lr = 0;
  double fwd_s = 0, bwd_s = 0;  // this rank's decoder time, summed over micro-steps
  int64_t documents = 0;        // in the global batch (DP x micro-steps sequences)
};

// A step whose loss or gradient norm is not finite: the optimizer did not step; `result` holds
// the step's numbers (for its metrics line) and the message says what to do.
class StepDiverged : public Error {
 public:
  StepDiverged(const std::string& what, const StepResult& r) : Error(what), result(r) {}
  StepResult result;
};

class Trainer {
 public:
  // world: all ranks. Splits it into CP and DP groups, builds the decoder and ZeRO-3 state
  // (uninitialised: call zero().init() or load a checkpoint).
  Trainer(Device& dev, Communicator& world, const ModelConfig& m, const TrainOptions& opt);
  ~Trainer();

  int cp_size() const { return cp_size_; }
  int dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }
  Communicator& cp() { return *cp_; }
  Communicator& dp() { return *dp_; }
  Zero3& zero() { return *zero_; }
  const Decoder& decoder() const { return *dec_; }
  const TrainOptions& options() const { return opt_; }
  // Tokens each rank processes per step: micro_steps * S / cp_size.
  int64_t tokens_per_rank_per_step() const;

  // Runs step t (counted from 0; AdamW's bias correction uses t + 1). One micro-step's sequence
  // is held at a time: with packed documents each is read twice (the loss's scale needs the
  // batch's predictions before the first forward).
  StepResult step(int64_t t, const SequenceFn& data);
  // The same step on sequences the caller owns; a view is used until `data`'s next call.
  StepResult step_views(int64_t t, const SequenceViewFn& data);
  // The mean next-token loss over sequences 0..n-1 of `data` (held-out data), forward only:
  // sequence i goes to DP rank i % DP (any n: a replica with one sequence fewer runs one
  // forward more that counts for nothing, since every forward's gathers span all ranks); the
  // same value on every rank.
  double evaluate(const std::function<Sequence(int64_t i)>& data, int64_t n);

 private:
  // The sum of `mine` over the DP groups, in rank order.
  double dp_sum(double mine) const;

  Device& dev_;
  Communicator& world_;
  ModelConfig m_;
  TrainOptions opt_;
  int cp_size_ = 0, dp_size_ = 0, dp_rank_ = 0;
  std::unique_ptr<Communicator> cp_, dp_;
  std::unique_ptr<Decoder> dec_;
  std::unique_ptr<Zero3> zero_;
};

}  // namespace upipe
