// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w over each `group`-wide column group of a (T, cols)
// tile: group = cols is the model's RMSNorm (w: (1, D)), group = d Qwen3's QK-norm of every
// head of a (T, heads*d) q or k (w: (1, d)). Backward accumulates the weight gradient (+=) and
// writes dx (which may be dy itself). Rows are independent, so the model can run it in tiles.
#pragma once

#include "backend/device.h"

namespace upipe {

int64_t rmsnorm_workspace_bytes(const Backend& be, int64_t group);

// x, y: (T, cols); w: (1, group), cols a multiple of group.
void rmsnorm_forward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& y,
                     int64_t group = 0);  // 0: the whole row
// dw: (1, group) fp32, accumulated.
void rmsnorm_backward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw, int64_t group = 0);

}  // namespace upipe
