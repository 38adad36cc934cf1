// SwiGLU gate: h = silu(a) * b on (T, F) tiles, and its backward (da, db).
#pragma once

#include "backend/device.h"

namespace upipe {

int64_t swiglu_workspace_bytes(const Backend& be, int64_t cols);

void swiglu_forward(Device& dev, const Mat& a, const Mat& b, const Mat& h);
void swiglu_backward(Device& dev, const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                     const Mat& db);

}  // namespace upipe
