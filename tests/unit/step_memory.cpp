#include "unit/step_memory.h"

#include <algorithm>

#include "backend/rmsnorm.h"
#include "core/checked.h"
#include "model/hf_names.h"
#include "model/lm_loss.h"
#include "model/mlp.h"

namespace upipe {

const char* step_moment_name(StepMoment m) {
  switch (m) {
    case StepMoment::kForwardLastMlp:
      return "the forward's last MLP";
    case StepMoment::kLossHead:
      return "the LM head and loss";
    case StepMoment::kLossNormBackward:
      return "the final norm's backward";
    case StepMoment::kLayerStartNorm:
      return "the last layer's start (norm workspace)";
    case StepMoment::kLayerStartXm:
      return "the last layer's start (xm built)";
    case StepMoment::kAttention:
      return "the last layer's attention";
    case StepMoment::kMlp:
      return "the last layer's MLP";
    case StepMoment::kRecomputeAttention:
      return "the recompute's attention forward (keeping)";
    case StepMoment::kInputNormBackward:
      return "the input norm's backward";
    case StepMoment::kKeptForwardAttention:
      return "the forward's last attention (keeping)";
  }
  return "?";
}

DecoderStepBytes decoder_step_bytes(const Backend& be, const ModelConfig& m,
                                    const DecoderOptions& opt, int64_t rows,
                                    const AttentionStrategy& strat) {
  const DType t = opt.memory.dtype, rt = opt.memory.residual_dtype, f32 = DType::kF32;
  const int64_t d = m.hidden_size, layers = m.num_hidden_layers;
  DecoderStepBytes b;
  for (const HfTensorSpec& s : hf_tensors(m)) {
    const int64_t r = s.shape.size() == 1 ? 1 : s.shape[0];
    b.params = checked_add(b.params, mat_bytes(r, s.shape.back(), t));
    b.grads = checked_add(b.grads, mat_bytes(r, s.shape.back(), f32));
  }
  // (S/C, D): res for x, xm, dx, dh (the residual dtype), half for h (the compute dtype).
  const int64_t res = mat_bytes(rows, d, rt), half = mat_bytes(rows, d, t);
  // Checkpoints: k per layer (the layer's input; per block also the MLP's input residual xm).
  const bool offload = opt.memory.offload_stash;
  const int64_t k = opt.memory.recompute == Recompute::kLayer ? 1 : 2;
  // Per layer with --checkpoint-granularity none: the MLP's kept gate and up products (tag mlp),
  // all L through the loss, L - 1 once the last layer's MLP backward is done.
  const bool keep_mlp = opt.memory.recompute == Recompute::kNone;
  const int64_t kept = keep_mlp ? 2 * mat_bytes(rows, m.intermediate_size, t) : 0;
  // A strategy that can keep (local) keeps its attention intermediates from a forward to the
  // backward: with none every layer's from the step's forward until its attention backward (with
  // the MLP's in kept_all / kept_rest); per layer one layer's from its recompute through its MLP
  // phase (recompute_kept). The attention moments below then use the keeping variant's forward
  // and backward peaks (which count the layer's own). Per block the backward runs no attention
  // forward.
  const bool keep_attn = keep_mlp && strat.can_stash();
  const bool keep_recompute = opt.memory.recompute == Recompute::kLayer && strat.can_stash();
  const StashedAttentionBytes ka =
      keep_attn || keep_recompute ? strat.stash_formula_bytes() : StashedAttentionBytes{};
  const int64_t kept_layer = kept + (keep_attn ? ka.kept : 0);
  const int64_t kept_all = checked_mul(layers, kept_layer, "kept bytes"),
                kept_rest = kept_all - kept_layer;
  const int64_t recompute_kept = keep_recompute ? ka.kept : 0;
  const int64_t attn_bytes = keep_attn || keep_recompute ? ka.backward : strat.attn_formula_bytes();
  const int64_t one_stash = mat_bytes(rows, d, opt.memory.stash_dtype);
  const int64_t all_stash = checked_mul(k * layers, one_stash, "checkpoint bytes");
  // Device checkpoints: after the last layer's xm checkpoint is consumed (per block) ...
  const int64_t last_stash = offload ? one_stash : all_stash - (k - 1) * one_stash;
  // ... and once the next layer's are fetched (offloaded: k more slots).
  const int64_t next_stash = offload ? one_stash + (layers > 1 ? k * one_stash : 0) : last_stash;
  b.stash = offload ? std::max(k * one_stash, next_stash) : all_stash;
  b.stash_host = offload ? all_stash : 0;
  const int64_t attn_peak = std::max(ka.forward, ka.backward);
  b.attn = keep_attn        ? checked_add(layers * ka.kept, attn_peak - ka.kept)
           : keep_recompute ? attn_peak
                            : attn_bytes;
  b.logits =
      lm_loss_peak_bytes(be, LmLossConfig{d, m.vocab_size, opt.memory.tile_tokens, t, rt}, rows);
  // The step's phases that can set the peak, each with the (S/C, D) buffers and device
  // checkpoints alive then (docs/model.md, "Memory"):
  // - the forward's last MLP: x, h and every device checkpoint (per block, with fp32
  //   checkpoints of a bf16 residual, this can be the peak);
  // - loss: x, h and dh with the LM head's tile; then x, dh and dx with the final norm's backward
  //   (all device checkpoints; offloaded: none on the device yet);
  // - the last layer's start: every device checkpoint (offloaded: its k slots), dx, h, and xm
  //   while it is built (per block: copied from its checkpoint, which is then freed);
  // - its attention: dx, h, and xm in the forward recompute or dh in the backward (the same
  //   size), with the strategy's intermediates, or the input norm's workspace before them;
  // - its MLP, T rows at a time: dx, h, xm and the (T, D) tiles h2 and g2 (h2 freed before the
  //   norm's backward);
  // - its input norm's backward: dx, dh and, offloaded, the next layer's slots fetched by then.
  // The forward's attention (x, h, a staging copy while a checkpoint is offloaded, the block's
  // forward, whose peak is at most its backward's) and earlier layers hold less.
  const MlpConfig mc{d, m.intermediate_size, opt.memory.tile_tokens, t, rt == f32};
  const int64_t norm_ws = rmsnorm_workspace_bytes(be, d);
  const int64_t loss_stash = offload ? 0 : all_stash;
  const int64_t start_stash = offload ? k * one_stash : all_stash;
  const int64_t tile = std::min(opt.memory.tile_tokens, rows);
  const int64_t h2 = mat_bytes(tile, d, t), g2 = mat_bytes(tile, d, rt);
  const int64_t mlp_bwd = mlp_backward_peak_bytes(be, mc, rows, keep_mlp);
  const int64_t mlp_fwd = mlp_forward_peak_bytes(be, mc, rows, keep_mlp);
  const int64_t attn_act = 2 * res + half;    // dx, h, and xm or dh
  b.act = std::max(2 * res + half, 3 * res);  // the loss phase's x, h, dh, then x, dh, dx
  b.mlp = checked_mul(layers, kept, "kept MLP bytes") + std::max(mlp_fwd, h2 + g2 + mlp_bwd);
  b.moments = {
      loss_stash + kept_all + res + half + std::max(mlp_fwd, norm_ws),
      loss_stash + kept_all + 2 * res + half + std::max(b.logits, norm_ws),
      loss_stash + kept_all + 3 * res + norm_ws,
      start_stash + kept_all + res + half + norm_ws,
      start_stash + kept_all + attn_act,
      last_stash + kept_rest + attn_act + std::max(attn_bytes, ka.kept + norm_ws),
      last_stash + kept_all + recompute_kept + attn_act +
          std::max({h2 + g2 + mlp_bwd, h2 + norm_ws, g2 + norm_ws}),
      // Per layer, keeping: the recompute's attention forward.
      keep_recompute ? last_stash + kept_rest + attn_act + ka.forward : 0,
      next_stash + kept_rest + 2 * res + norm_ws,
      // Keeping attention: the forward's last attention, with every earlier layer's kept
      // intermediates and the device checkpoints saved by then.
      keep_attn ? (offload ? 0 : last_stash) + kept_rest + res + half + ka.forward : 0,
  };
  const int64_t step = *std::max_element(b.moments.begin(), b.moments.end());
  b.peak = checked_add(b.params + b.grads, step, "step bytes");
  return b;
}

}  // namespace upipe
