// The learning-rate schedule (train/trainer.h): linear warmup from lr / warmup at step 0 to lr at
// step warmup - 1, lr at step warmup, cosine decay to min_lr at the last step (steps - 1), min_lr
// after it, and lr throughout when there is nothing to decay over.
#include <gtest/gtest.h>

#include <cmath>

#include "train/trainer.h"

namespace upipe {
namespace {

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  const LrSchedule s{1e-3, 1e-4, 4, 25};  // lr, min_lr, warmup, steps
  for (int64_t t = 0; t < 4; ++t) EXPECT_DOUBLE_EQ(s.lr_at(t), 1e-3 * double(t + 1) / 4) << t;
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1e-3);
  // Steps 4 .. 24 span the half cosine: halfway (step 14) is the mean of lr and min_lr.
  EXPECT_NEAR(s.lr_at(14), 5.5e-4, 1e-15);
  EXPECT_NEAR(s.lr_at(9), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(s.lr_at(24), 1e-4, 1e-15);
  EXPECT_NEAR(s.lr_at(100), 1e-4, 1e-15);
  for (int64_t t = 4; t < 24; ++t) EXPECT_GT(s.lr_at(t), s.lr_at(t + 1)) << t;
  const LrSchedule flat{1e-3, 1e-4, 0, 1};
  EXPECT_DOUBLE_EQ(flat.lr_at(0), 1e-3);
  EXPECT_DOUBLE_EQ(flat.lr_at(5), 1e-3);
}

}  // namespace
}  // namespace upipe
