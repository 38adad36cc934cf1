// SwiGLU gate: h = silu(a) * b on (T, F) tiles, and its backward (da, db).
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

// fp32 row staging: three rows of F.
inline int64_t swiglu_workspace_bytes(int64_t cols) {
  return 3 * cols * 4;
}

void swiglu_forward(Device& dev, const Mat& a, const Mat& b, const Mat& h);
void swiglu_backward(Device& dev, const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                     const Mat& db);

}  // namespace upipe
