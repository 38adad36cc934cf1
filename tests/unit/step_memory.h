// The decoder step's per-rank device bytes in closed form (docs/model.md, "Memory"): what
// Decoder::run allocates, written apart from it from the same size functions the blocks allocate
// with. This is a test oracle, not the planner's fast path: `upipe plan` (src/plan) runs the step
// itself on the meta device, and tests/unit/test_step_memory.cpp requires a meta-device step to
// peak at exactly `peak`, so a change to the order in which the decoder holds its buffers that
// this formula does not state fails there.
#pragma once

#include <array>
#include <cstdint>

#include "model/decoder.h"

namespace upipe {

// The moments of the step that can set its peak (docs/model.md, "Memory"), in the formula's
// order; the keeping moments exist only when the strategy keeps its intermediates.
enum class StepMoment {
  kForwardLastMlp,        // the forward's last MLP: x, h
  kLossHead,              // the LM head and loss: x, h, dh
  kLossNormBackward,      // the final norm's backward: x, dh, dx
  kLayerStartNorm,        // the last layer's start: dx, h and the norm's workspace
  kLayerStartXm,          // ... and xm being built
  kAttention,             // its attention: dx, h, and xm (forward recompute) or dh
  kMlp,                   // its MLP phase: dx, h, xm and the (T, D) tiles
  kRecomputeAttention,    // per layer, keeping: the recompute's attention forward
  kInputNormBackward,     // its input norm's backward: dx, dh
  kKeptForwardAttention,  // none, keeping: the forward's last attention
};
inline constexpr int kNumStepMoments = int(StepMoment::kKeptForwardAttention) + 1;
const char* step_moment_name(StepMoment m);

struct DecoderStepBytes {
  int64_t params = 0;      // every parameter in the compute dtype (tag params)
  int64_t grads = 0;       // every gradient in fp32 (tag grads)
  int64_t stash = 0;       // device stash at its peak: L fp32 (S/C, D), or 2 slots with offload
  int64_t stash_host = 0;  // host-arena checkpoints with offload: L fp32 (S/C, D)
  int64_t act = 0;         // (S/C, D) buffers at their peak: x, dx, dh, xm fp32; h dtype
  int64_t attn = 0;        // the strategy's attention intermediates (its attn_formula_bytes; kept
                           // ones: every layer's, and the backward's peak beyond its own)
  int64_t mlp = 0;         // the MLP phase: (T, D) tiles h2, g2 + the (T, F) tiles + workspace
  int64_t logits = 0;      // the fused LM head's peak (lm_loss_peak_bytes: (T, V) tile + ws)
  int64_t peak = 0;        // the step's device peak, params and grads included
  // Each moment's bytes beyond params and grads (0 where it does not occur); peak = params +
  // grads + the largest.
  std::array<int64_t, kNumStepMoments> moments{};
};

// rows: this rank's tokens (S/C); strat: the decoder's strategy (its attn_formula_bytes(), or
// with --checkpoint-granularity none and can_stash() its stash_formula_bytes()).
DecoderStepBytes decoder_step_bytes(const Backend& be, const ModelConfig& m,
                                    const DecoderOptions& opt, int64_t rows,
                                    const AttentionStrategy& strat);

}  // namespace upipe
