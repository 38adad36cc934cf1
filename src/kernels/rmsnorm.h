// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of a (T, D) tile; backward accumulates
// the weight gradient (+=) and writes dx. Rows are independent, so the model can run it in
// tiles of T tokens.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

// fp32 row staging: three rows of D.
inline int64_t rmsnorm_workspace_bytes(int64_t cols) {
  return 3 * cols * 4;
}

// x, y: (T, D); w: (1, D).
void rmsnorm_forward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& y);
// dw: (1, D) fp32, accumulated.
void rmsnorm_backward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw);

}  // namespace upipe
