// The LM head fused with cross-entropy, tiled over rows: logits = h W^T exist only as (T, V) fp32
// tiles (tag logits), never (S/C, V). Each tile's loss and its gradient (softmax - onehot) are
// computed at once by the backend's cross-entropy op (backend/loss.h: a log-sum-exp in fp32 with
// row sums in fp64, in place on the tile), and turned straight into dh and dW, so forward and
// backward are one call.
#pragma once

#include <cstdint>
#include <span>

#include "backend/device.h"

namespace upipe {

struct LmLossConfig {
  int64_t hidden = 0;     // D
  int64_t vocab = 0;      // V
  int64_t tile_rows = 0;  // T: rows per logits tile (a shorter last tile when T does not divide)
  DType dtype = DType::kF32;       // h and W
  DType grad_dtype = DType::kF32;  // dh
};

// Returns scale * sum over rows r with labels[r] >= 0 of -log softmax(h W^T)[r, labels[r]]
// (the model passes scale = 1/(S-1) for transformers' mean; summing the ranks' returns gives it),
// and writes its gradients: dh = d(loss)/dh (overwritten; 0 on rows without a label) and
// dw = dw_beta * dw + d(loss)/dW (fp32, dw_beta 0 or 1; tied embeddings pass 1).
//   h       (S/C, D) dtype: the final RMSNorm's output
//   w       (V, D) dtype: the LM head
//   labels  (S/C) on the host: the target token of each row in [0, V), or -1 for "no prediction"
//           (the sequence's last token)
//   dh      (S/C, D) grad_dtype
//   dw      (V, D) fp32
//   group   optional (S/C) flags on the host: *group_sum receives the unscaled sum of the losses
//           of the flagged rows (e.g. the copied half of the copy task), computed in the same pass
double lm_loss(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
               std::span<const int32_t> labels, float scale, const Mat& dh, const Mat& dw,
               float dw_beta, std::span<const uint8_t> group = {}, double* group_sum = nullptr);

// The same loss without gradients (evaluation): the (T, V) logits tiles and the cross-entropy
// only, the same bits as lm_loss's value.
double lm_loss_value(Device& dev, const LmLossConfig& c, const Mat& h, const Mat& w,
                     std::span<const int32_t> labels, float scale,
                     std::span<const uint8_t> group = {}, double* group_sum = nullptr);

// Peak device bytes lm_loss allocates on `rows` rows (everything but h, w, dh, dw): the fp32
// (T, V) logits tile plus the largest of its three GEMMs' workspaces. Independent of rows once
// rows >= T.
int64_t lm_loss_peak_bytes(const Backend& be, const LmLossConfig& c, int64_t rows);

}  // namespace upipe
