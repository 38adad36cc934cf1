// Small data-movement ops on matrix views: zero, copy, add. On meta they do nothing.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace upipe {

void zero(Device& dev, const Mat& x);
// dst = src (same shape; dtypes may differ, converted through fp32).
void copy(Device& dev, const Mat& dst, const Mat& src);
// dst += src, both fp32.
void add_into(Device& dev, const Mat& dst, const Mat& src);
// dst (r, c) = beta * dst + src^T, src (c, r); both fp32.
void add_transposed(Device& dev, const Mat& dst, const Mat& src, float beta);

}  // namespace upipe
