// Optimizer front-ends: the squared norm of a gradient and the AdamW update, on the device that
// holds the fp32 master weights, gradients and moments (ZeRO shards in training, train/zero.h).
#pragma once

#include "backend/device.h"

namespace upipe {

// Sum of x^2 (fp32 x), accumulated in fp64 in a fixed order: the same bits on every run.
double sum_squares(Device& dev, const Mat& x);
// One AdamW step (backend.h's AdamWArgs) on w with gradient g and moments m, v; all fp32, same
// shape.
void adamw(Device& dev, const Mat& w, const Mat& g, const Mat& m, const Mat& v, const AdamWArgs& a);

}  // namespace upipe
