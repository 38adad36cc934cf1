// train.time_limit, a job's wall clock (a batch scheduler's): when a run stops so that it ends,
// its last step checkpointed, before the limit. Counted from the process's start (the launch,
// MPI's start and the loading count). After each step the loop asks whether going on would end
// past the limit: this step's own validation and checkpoint where they are due, the next step,
// then the validation and checkpoint a stop runs, each at what it has cost so far. The decision
// is this rank's; the loop all-reduces it, so every rank stops after the same step.
#pragma once

#include <cstdint>

namespace upipe {

// Seconds since this process started (/proc/self/stat's start time against CLOCK_BOOTTIME); 0
// where it cannot be read.
double process_age_s();

// What the run's pieces cost so far, in seconds (0: none, or not known yet).
struct TimeLimitCosts {
  double next_step = 0;   // the longest timed step (the warm-up step's while none is timed)
  double validation = 0;  // one validation: the mean of those run, or a guess from timed steps
  double checkpoint = 0;  // one checkpoint: the longest written, or a guess from its bytes
};

class TimeLimit {
 public:
  // limit_s = 0: no limit. `now` on the loop's clock, `age` the process's age then.
  TimeLimit(int64_t limit_s, double now, double age);
  bool set() const { return set_; }
  // The limit has passed (before the first step: no step runs).
  bool passed(double now) const { return set_ && now >= deadline_; }
  // After a step, at `now`: whether going on would end past the limit.
  bool stop_after_step(double now, const TimeLimitCosts& c, bool validation_due,
                       bool checkpoint_due) const;

 private:
  bool set_ = false;
  double deadline_ = 0;
};

}  // namespace upipe
