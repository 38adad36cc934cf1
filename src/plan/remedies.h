// What makes a training step that does not fit fit: the settings that lower a step's memory
// (the method's knobs auto, no stage overlap, per-layer recompute, the stash offloaded, smaller
// MLP / LM-head tiles, a bf16 stash, bf16 compute), each planned on the meta device alone,
// cheapest first, or the fewest of them together. `upipe plan` lists them under a plan that does
// not fit, and under the longest S (--max-seq-len) those that go further (docs/planner.md, "What
// makes it fit").
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "plan/planner.h"
#include "train/run_config.h"

namespace upipe {

struct Remedy {
  RunConfig config;   // the run's settings with the change (an auto knob still auto)
  std::string flags;  // what changes, as train's flags ("--offload-stash=true"; knobs as chosen)
  std::string costs;  // what it costs ("the stash in host memory"), each step's joined by "; "
  bool exact = true;  // whether the run computes the same bits as without the change
  Plan plan;          // complete; fits
};

// The steps tried, in their order, by name ("the knobs auto", ...).
std::vector<std::string> remedy_step_names();

// For `failed`, the plan of the settings `c` that does not fit (`base`: the request it was
// planned from; its method the plan's): each step alone that fits, in order; where none does, the
// fewest together (the shortest run of steps in order that fits, then without each earlier one it
// does not need); none where even all of them together do not fit.
std::vector<Remedy> remedies(const ModelConfig& m, const RunConfig& c, const PlanRequest& base,
                             const Plan& failed);

// For `longest`, the longest S that fits the settings `c` (max_seq_len of `base` with the plan's
// method; fits = false where not even the shortest does): each step alone whose longest S is
// longer (the Remedy's plan is max_seq_len's at it), in order; then the exact ones of those
// together where that goes further still than each alone. None past the longest S train takes.
std::vector<Remedy> longer(const ModelConfig& m, const RunConfig& c, const PlanRequest& base,
                           const Plan& longest);

}  // namespace upipe
