// Cross-entropy front-end: the per-tile step of the fused LM head + loss (model/lm_loss.h), on
// the device that holds the logits tile.
#pragma once

#include <span>

#include "backend/device.h"

namespace upipe {

// logits (T, V) fp32, in place -> scale * (softmax - onehot) per labelled row, 0 for label -1.
// labels: T ids in [0, V) or -1, on the host. Returns the tile's unscaled sum of
// -log softmax[label] (0 on a device that does not compute).
double cross_entropy(Device& dev, const Mat& logits, std::span<const int32_t> labels, float scale);

}  // namespace upipe
