#include "model/step_memory.h"

#include <algorithm>

#include "backend/rmsnorm.h"
#include "core/checked.h"
#include "model/hf_names.h"
#include "model/lm_loss.h"
#include "model/mlp.h"

namespace upipe {

DecoderStepBytes decoder_step_bytes(const Backend& be, const ModelConfig& m,
                                    const DecoderOptions& opt, int64_t rows, int64_t attn_bytes) {
  const DType t = opt.attn.dtype, rt = opt.residual_dtype, f32 = DType::kF32;
  const int64_t d = m.hidden_size, layers = m.num_hidden_layers;
  DecoderStepBytes b;
  for (const HfTensorSpec& s : hf_tensors(m)) {
    const int64_t r = s.shape.size() == 1 ? 1 : s.shape[0];
    b.params = checked_add(b.params, mat_bytes(r, s.shape.back(), t));
    b.grads = checked_add(b.grads, mat_bytes(r, s.shape.back(), f32));
  }
  // (S/C, D): res for x, xm, dx, dh (the residual dtype), half for h (the compute dtype).
  const int64_t res = mat_bytes(rows, d, rt), half = mat_bytes(rows, d, t);
  const int64_t one_ckpt = mat_bytes(rows, d, opt.checkpoint_dtype);
  const int64_t all_ckpt = checked_mul(layers, one_ckpt, "checkpoint bytes");
  b.ckpt = opt.offload_checkpoints ? std::min<int64_t>(layers, 2) * one_ckpt : all_ckpt;
  b.ckpt_host = opt.offload_checkpoints ? all_ckpt : 0;
  b.attn = attn_bytes;
  b.logits = lm_loss_peak_bytes(be, LmLossConfig{d, m.vocab_size, opt.tile_tokens, t, rt}, rows);
  // The step's phases that can set the peak, each with the (S/C, D) buffers and device
  // checkpoints alive then (docs/model.md, "Memory"):
  // - loss: x, h and dh with the LM head's tile; then x, dh and dx with the final norm's backward
  //   (all device checkpoints; offloaded: none on the device yet);
  // - the last layer's attention (every device checkpoint, or its one slot): dx, h, and xm in
  //   the forward recompute or dh in the backward (the same size), with the strategy's
  //   intermediates, or the input norm's workspace before them;
  // - its MLP, T rows at a time: dx, h, xm and the (T, D) tiles h2 and g2 (h2 freed before the
  //   norm's backward);
  // - its input norm's backward: dx, dh and, offloaded, the next layer's slot fetched by then.
  // The forward (x, h, a staging copy while a checkpoint is offloaded, the same blocks' forward,
  // whose peaks are at most their backward's) and earlier layers (fewer checkpoints) hold less.
  const MlpConfig mc{d, m.intermediate_size, opt.tile_tokens, t, rt == f32};
  const int64_t norm_ws = rmsnorm_workspace_bytes(be, d);
  const int64_t loss_ckpt = opt.offload_checkpoints ? 0 : all_ckpt;
  const int64_t last_ckpt = opt.offload_checkpoints ? one_ckpt : all_ckpt;
  const int64_t tile = std::min(opt.tile_tokens, rows);
  const int64_t h2 = mat_bytes(tile, d, t), g2 = mat_bytes(tile, d, rt);
  const int64_t mlp_bwd = mlp_backward_peak_bytes(be, mc, rows);
  const int64_t attn_act = 2 * res + half;  // dx, h, and xm or dh
  b.act = std::max(2 * res + half, 3 * res);  // the loss phase's x, h, dh, then x, dh, dx
  b.mlp = std::max(mlp_peak_bytes(be, mc, rows), h2 + g2 + mlp_bwd);
  const int64_t step = std::max({
      loss_ckpt + 2 * res + half + std::max(b.logits, norm_ws),
      loss_ckpt + 3 * res + norm_ws,
      last_ckpt + attn_act + std::max(attn_bytes, norm_ws),
      last_ckpt + attn_act + std::max({h2 + g2 + mlp_bwd, h2 + norm_ws, g2 + norm_ws}),
      b.ckpt + 2 * res + norm_ws,
  });
  b.peak = checked_add(b.params + b.grads, step, "step bytes");
  return b;
}

}  // namespace upipe
