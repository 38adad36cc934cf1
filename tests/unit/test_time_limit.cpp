// train.time_limit's decision (src/train/time_limit.h) on a clock of its own: a run goes on while
// what going on costs (this step's due validation and checkpoint, the next step, then the stop's
// validation and checkpoint) ends before the limit; the process's age moves the deadline back.
#include <gtest/gtest.h>

#include "train/time_limit.h"

namespace upipe {
namespace {

TEST(TimeLimit, GoesOnWhileEverythingAfterTheStepEndsBeforeTheLimit) {
  const TimeLimit none(0, 0, 0);
  EXPECT_FALSE(none.set());
  EXPECT_FALSE(none.passed(1e9));
  EXPECT_FALSE(none.stop_after_step(1e9, {1, 1, 1}, true, true));
  // 100 s from the process's start, 10 s of which had passed when the loop began (at 50).
  const TimeLimit limit(100, 50, 10);
  EXPECT_TRUE(limit.set());
  EXPECT_FALSE(limit.passed(139.9));
  EXPECT_TRUE(limit.passed(140));
  const TimeLimitCosts c{1, 10, 5};  // a step, a validation, a checkpoint
  // At 120: the next step and the stop's validation and checkpoint end at 136.
  EXPECT_FALSE(limit.stop_after_step(120, c, false, false));
  EXPECT_TRUE(limit.stop_after_step(124.5, c, false, false));
  // This step's own validation and checkpoint come first where they are due (a run that went on
  // into them ended past its limit).
  EXPECT_TRUE(limit.stop_after_step(120, c, true, false));   // 120 + 10 + 16 = 146
  EXPECT_TRUE(limit.stop_after_step(120, c, false, true));   // 120 + 5 + 16 = 141
  EXPECT_TRUE(limit.stop_after_step(110, c, true, true));    // 110 + 15 + 16 = 141
  EXPECT_FALSE(limit.stop_after_step(108, c, true, true));   // 108 + 15 + 16 = 139
}

TEST(TimeLimit, TheProcessAgeIsCounted) {
  const double age = process_age_s();
  EXPECT_GT(age, 0) << "this process has run for some time";
  EXPECT_LT(age, 3600) << "a test process younger than an hour";
}

}  // namespace
}  // namespace upipe
