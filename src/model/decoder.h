// The Llama-3 / Qwen3 decoder over a CP group: embedding -> L x [RMSNorm -> attention ->
// residual add; RMSNorm -> SwiGLU MLP -> residual add] -> final RMSNorm -> fused LM head +
// cross-entropy, forward and backward in one call, with any attention strategy.
//
// The residual stream is fp32 and every block accumulates into it (beta = 1), so no block keeps
// an (S/C, D) output of its own. Full activation checkpointing: forward keeps each layer's input
// (tag ckpt; in the host arena with offload_checkpoints) and backward recomputes the layer from it
// (the attention forward runs twice per layer per step: once in forward, once to rebuild the MLP's
// input in backward, plus the strategy's own recompute inside its backward). The loss has
// transformers' `labels = input_ids` semantics: the mean over the S-1 next-token predictions of the
// whole sequence; a row's label is the token at the next global position, whichever rank holds it,
// so every layout (contiguous, zigzag, chunked, grid) gets its labels right.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "attention/strategy.h"
#include "model/config.h"

namespace upipe {

// Parameters by Hugging Face name (hf_names.h): compute copies in the model dtype (tag params),
// or their fp32 gradients (tag grads). A tied model has no "lm_head.weight".
using ParamMap = std::map<std::string, Tensor>;

// Allocates every parameter of m in `dtype` (uninitialised) on dev, tagged `tag`.
ParamMap allocate_params(Device& dev, const ModelConfig& m, DType dtype, Tag tag);

struct DecoderOptions {
  std::string method = "local";  // attention strategy (strategy.h)
  AttentionConfig attn;          // seq_len, dtype (compute) and the strategy knobs; the block's
                                 // shape fields are filled from the model
  int64_t tile_tokens = 1024;    // T of the tiled MLP and the fused LM head
  // Keep the layer checkpoints in the host arena (tag ckpt) instead of the device's; backward
  // fetches them back one layer ahead into two device slots.
  bool offload_checkpoints = false;
};

class Decoder {
 public:
  // cp: the context-parallel group that shares one sequence. Validates the options
  // (ConfigError) and builds the attention strategy.
  Decoder(Device& dev, Communicator& cp, const ModelConfig& m, const DecoderOptions& opt);
  const AttentionStrategy& strategy() const { return *strat_; }

  // One forward + backward of the sequence `tokens` (all S ids, on every rank). Writes this
  // rank's contribution to every gradient (g, fp32, overwritten; the CP group's sum is the full
  // gradient) and returns the loss of the whole sequence (the same on every rank).
  double loss_and_grads(std::span<const int32_t> tokens, const ParamMap& w, const ParamMap& g);
  // Wall time of the last call's forward (to the loss) and backward, seconds.
  double forward_seconds() const { return fwd_s_; }
  double backward_seconds() const { return bwd_s_; }

 private:
  const Tensor& param(const ParamMap& p, const std::string& name) const;
  AttentionWeights attn_weights(const ParamMap& p, int layer) const;
  AttentionGrads attn_grads(const ParamMap& p, int layer) const;

  Device& dev_;
  Communicator& cp_;
  ModelConfig m_;
  DecoderOptions opt_;
  std::unique_ptr<AttentionStrategy> strat_;
  double fwd_s_ = 0, bwd_s_ = 0;
};

}  // namespace upipe
