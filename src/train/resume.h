// Resuming a run: the run a checkpoint records (its run file, kept in meta.json) is the run that
// continues. What the user gives on top of it (a run file, flags) overrides it, and every setting
// that then differs from the recorded run is reported, by what it means (ResumeRule, the settings
// table): a change to what the remaining steps compute on (the model, the data, the sequence, the
// global batch: the DP size) is refused unless accepted explicitly; a change of the schedule or
// the optimizer takes effect from the next step (the learning rate it then has is shown); a
// change of arithmetic (method, dtypes, tiles) continues the same computation, not bitwise the
// uninterrupted run's; the rest (memory, logging, checkpoint cadence) is free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/run_config.h"

namespace upipe {

// The recorded run and where it stands.
struct RecordedRun {
  RunConfig config;    // its run file
  int64_t step = 0;    // steps done
  int world = 0;       // ranks it was written on
  int cp_size = 0;     // its CP group size
  std::string source;  // the checkpoint, for messages
  std::string data;    // the fingerprint of the data it read ("": its build did not record one)
};

struct SettingChange {
  std::string key, from, to;
  ResumeRule rule;
};

// The settings whose values differ between the recorded run and `now`, in the table's order.
std::vector<SettingChange> setting_changes(const RunConfig& recorded, const RunConfig& now);

// Checks that `now` (on `world` ranks) may continue `rec`; returns the lines to report. Throws
// ConfigError when no step is left (train.steps <= the recorded step), or when a change breaks
// what the remaining steps compute on and `accept` is false (naming each such setting and
// --accept-changes).
std::vector<std::string> check_resume(const RecordedRun& rec, const RunConfig& now, int world,
                                      bool accept);

// A recorded run of the copy or random task that names data.path or data.val_path (older builds
// took `--data-path F` alone and never read F; validation now refuses it): the paths dropped from
// `recorded`, so the run resumes as it ran; a line saying so for each path dropped.
std::vector<std::string> drop_unread_paths(RunConfig& recorded);

}  // namespace upipe
