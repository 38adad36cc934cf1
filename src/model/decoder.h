// The Llama-3 / Qwen3 decoder over a CP group: embedding -> L x [RMSNorm -> attention ->
// residual add; RMSNorm -> SwiGLU MLP -> residual add] -> final RMSNorm -> fused LM head +
// cross-entropy, forward and backward in one call, with any attention strategy.
//
// The residual stream is fp32 (or bf16, MemoryPolicy::residual_dtype) and every block
// accumulates into it (beta = 1), so no block keeps an (S/C, D) output of its own. Full
// activation checkpointing: forward keeps each layer's input (tag ckpt; in the host arena with
// offload_stash) and backward recomputes the layer from it (the attention forward runs twice
// per layer per step: once in forward, once to rebuild the MLP's input in backward, plus the
// strategy's own recompute inside its backward). The loss has transformers' `labels = input_ids`
// semantics: the mean over the S-1 next-token predictions of the whole sequence; a row's label is
// the token at the next global position, whichever rank holds it, so every layout (contiguous,
// zigzag, chunked, grid) gets its labels right. docs/model.md, "Memory", lists which buffer lives
// when (model/step_memory.h is its closed form).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "attention/strategy.h"
#include "model/config.h"
#include "model/memory_policy.h"
#include "model/param_source.h"

namespace upipe {

// Allocates every parameter of m in `dtype` (uninitialised) on dev, tagged `tag`.
ParamMap allocate_params(Device& dev, const ModelConfig& m, DType dtype, Tag tag);

struct DecoderOptions {
  int64_t seq_len = 0;  // S, split over the CP group
  MethodKnobs knobs;    // the attention strategy and its knobs (attention/methods.h)
  MemoryPolicy memory;  // dtypes, recompute and stash, tile size (model/memory_policy.h)
};

// What the loss of one sequence is: its scale and an optional group of predictions to report.
struct LossSpec {
  // Multiplies the sum of the token losses (and so every gradient); 0 means 1/(S-1),
  // transformers' mean over the sequence. Training passes 1/(tokens predicted in the global
  // batch), so the summed gradient is the batch mean whatever the DP x CP split.
  double scale = 0;
  // Optional: S flags by global position p, whether the prediction at p (label = token p+1)
  // belongs to the group whose unscaled loss sum StepLoss::group_sum reports (e.g. the copied
  // half of the copy task).
  std::span<const uint8_t> group;
};

struct StepLoss {
  double loss = 0;       // scale * the sum of the sequence's token losses (the same on every rank)
  double group_sum = 0;  // the unscaled sum of the group's token losses (0 without a group)
};

class Decoder {
 public:
  // cp: the context-parallel group that shares one sequence. Validates the options
  // (ConfigError) and builds the attention strategy.
  Decoder(Device& dev, Communicator& cp, const ModelConfig& m, const DecoderOptions& opt);
  const AttentionStrategy& strategy() const { return *strat_; }

  // One forward + backward of the sequence `tokens` (all S ids, on every rank), with the weights
  // and gradient buffers of `p` (param_source.h: one unit at a time, in order of use). Writes this
  // rank's contribution to every gradient (fp32, overwritten; the CP group's sum is the full
  // gradient) and returns the loss of the whole sequence.
  StepLoss run(std::span<const int32_t> tokens, ParamSource& p, const LossSpec& spec = {});
  // The same with whole replicated parameters (FullParams) and transformers' mean loss.
  double loss_and_grads(std::span<const int32_t> tokens, const ParamMap& w, const ParamMap& g);
  // Wall time of the last call's forward (to the loss) and backward, seconds.
  double forward_seconds() const { return fwd_s_; }
  double backward_seconds() const { return bwd_s_; }

 private:
  AttentionWeights attn_weights(const ParamViews& p, int layer) const;
  AttentionGrads attn_grads(const ParamViews& p, int layer) const;

  Device& dev_;
  Communicator& cp_;
  ModelConfig m_;
  DecoderOptions opt_;
  AttentionConfig attn_;  // the block's: the model's shape with the options' S, dtype and knobs
  std::unique_ptr<AttentionStrategy> strat_;
  double fwd_s_ = 0, bwd_s_ = 0;
};

}  // namespace upipe
