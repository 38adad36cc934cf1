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
  const DType t = opt.attn.dtype, f32 = DType::kF32;
  const int64_t d = m.hidden_size, layers = m.num_hidden_layers;
  DecoderStepBytes b;
  for (const HfTensorSpec& s : hf_tensors(m)) {
    const int64_t r = s.shape.size() == 1 ? 1 : s.shape[0];
    b.params = checked_add(b.params, mat_bytes(r, s.shape.back(), t));
    b.grads = checked_add(b.grads, mat_bytes(r, s.shape.back(), f32));
  }
  const int64_t res = mat_bytes(rows, d, f32), half = mat_bytes(rows, d, t);  // (S/C, D)
  const int64_t one_ckpt = mat_bytes(rows, d, opt.checkpoint_dtype);
  const int64_t all_ckpt = checked_mul(layers, one_ckpt, "checkpoint bytes");
  b.ckpt = opt.offload_checkpoints ? std::min<int64_t>(layers, 2) * one_ckpt : all_ckpt;
  b.ckpt_host = opt.offload_checkpoints ? all_ckpt : 0;
  b.attn = attn_bytes;
  b.logits = lm_loss_peak_bytes(be, LmLossConfig{d, m.vocab_size, opt.tile_tokens, t, f32}, rows);
  // The step's phases that can set the peak, each with the (S/C, D) buffers and device
  // checkpoints alive then. Loss and the final norm's backward: x, h, dx, dh, all L checkpoints
  // (offloaded: none on the device yet). Backward of the last layer, where every device checkpoint
  // (or both slots) is still held: x is gone, xm holds the attention recompute and backward's
  // residual, + h2 for the MLP backward and the norm before it. The forward (x, h, a bf16
  // staging copy while a checkpoint is offloaded, and the same blocks' forward, whose peaks are
  // at most their backward's) and earlier layers (fewer checkpoints) hold less.
  const MlpConfig mc{d, m.intermediate_size, opt.tile_tokens, t, true};
  const int64_t loss_act = 3 * res + half, bwd_act = loss_act;
  const int64_t loss_ckpt = opt.offload_checkpoints ? 0 : all_ckpt;
  const int64_t norm_ws = rmsnorm_workspace_bytes(be, d);
  b.act = bwd_act + half;
  b.mlp = mlp_peak_bytes(be, mc, rows);
  const int64_t step = std::max({
      loss_ckpt + loss_act + std::max(b.logits, norm_ws),
      b.ckpt + bwd_act + std::max(attn_bytes, norm_ws),
      b.ckpt + b.act + std::max(mlp_backward_peak_bytes(be, mc, rows), norm_ws),
  });
  b.peak = checked_add(b.params + b.grads, step, "step bytes");
  return b;
}

}  // namespace upipe
